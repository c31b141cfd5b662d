"""What torch.compile itself costs per training step, before any backend works.

    python -m benchmarks.floor [--workloads mlp_b32,transformer] [--steps 200]

Issue 8 asks ``torch.compile(backend="tpu")`` to run a training step within
1.1x of the hand-written ``jax.jit`` step, timed as the suite times a step:
the step, then a wait for its loss. In that measurement the host's work and
the device's run one after the other, so the compiled step's host work must
fit in a tenth of the ``jax.jit`` step.

This measures the part of that host work no backend can remove: the same
workload on CPU under ``torch.compile`` with a *null backend*, whose
forward, backward and optimizer graphs compute nothing (each returns fresh
uninitialised tensors of its outputs' layouts, after one real run to learn
them). What remains is dynamo's frame entry and guards, AOTAutograd's
runtime wrappers, the autograd engine and the optimizer's Python, per step.
It is printed beside the ``jax.jit`` step (same process, interleaved) and the
1.1x budget (a tenth of the ``jax.jit`` step). Run with the suite's thread
settings (one compute thread).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

from benchmarks import settings


def _null_compiler(gm, example_inputs):
    """An FX graph that computes nothing: its outputs' layouts, uninitialised."""
    first: list = []

    def run(args: list):
        import torch  # noqa: PLC0415

        if not first:
            first.append(gm(*args))
        args.clear()
        # integer outputs (targets saved for backward) keep their values: the backward's
        # one real run indexes with them
        return [
            torch.empty_strided(o.shape, o.stride(), dtype=o.dtype)
            if isinstance(o, torch.Tensor) and o.is_floating_point()
            else o
            for o in first[0]
        ]

    run._boxed_call = True
    return run


def null_backend(gm, example_inputs):
    """A ``torch.compile`` backend through AOTAutograd whose graphs compute nothing."""
    from torch._functorch.aot_autograd import aot_module_simplified  # noqa: PLC0415

    return aot_module_simplified(
        gm,
        example_inputs,
        fw_compiler=_null_compiler,
        bw_compiler=_null_compiler,
        keep_inference_input_mutations=True,
    )


def measure(name: str, steps: int, small: bool = False) -> dict:
    import torch  # noqa: PLC0415

    import lazytpu  # noqa: F401, PLC0415 (JAX configured as the suite has it: x64 on)
    from benchmarks import jax_workloads as J  # noqa: PLC0415
    from benchmarks.workloads import SMALL_SIZES, WORKLOADS  # noqa: PLC0415

    factory, kwargs, _ = WORKLOADS[name]
    kwargs = SMALL_SIZES[name] if small else kwargs
    workload = factory("cpu", **kwargs)
    workload.compile(functools.partial(torch.compile, backend=null_backend), optimizer=True)
    jw = J.BUILDERS[name](factory("cpu", **kwargs).init_state)
    for _ in range(10):
        workload.step().item()
        jw.step()
        jw.wait()
    null, jax_step = [], []
    for _ in range(steps):
        start = time.perf_counter()
        workload.step().item()
        null.append(time.perf_counter() - start)
        start = time.perf_counter()
        jw.step()
        jw.wait()
        jax_step.append(time.perf_counter() - start)
    null_ms, jax_ms = statistics.median(null) * 1e3, statistics.median(jax_step) * 1e3
    return {"workload": name, "null_ms": null_ms, "jax_ms": jax_ms, "budget_ms": 0.1 * jax_ms}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="mlp_b32,mlp_b256,transformer")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="tiny sizes (a smoke test, not a measurement)")
    args = parser.parse_args(argv)
    settings.configure_environment(args.threads)
    print(f"{'workload':<12} {'null backend':>13} {'jax.jit step':>13} {'1.1x budget':>12} {'null/budget':>12}")
    for name in args.workloads.split(","):
        r = measure(name, args.steps, args.small)
        print(
            f"{name:<12} {r['null_ms']:>10.3f} ms {r['jax_ms']:>10.3f} ms {r['budget_ms']:>9.3f} ms "
            f"{r['null_ms'] / r['budget_ms']:>12.1f}"
        )
    print(
        "null backend: torch.compile's own host time per step (graphs compute nothing); "
        "budget: what 1.1x of the jax.jit step leaves for all host work when host and device run in series"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
