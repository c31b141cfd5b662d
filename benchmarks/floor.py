"""What torch.compile itself costs per training step, before any backend works.

    python -m benchmarks.floor [--workloads mlp_b32,transformer] [--steps 200]

Issue 8 asks ``torch.compile(backend="tpu")`` to run a training step within
1.1x of the hand-written ``jax.jit`` step. This measures how close *any*
torch.compile backend can get on this machine.

The same workload runs on CPU under ``torch.compile`` with a *null backend*,
whose forward, backward and optimizer graphs compute nothing (each returns
fresh uninitialised tensors of its outputs' layouts, after one real run to
learn them). What remains is torch's own host work per step: dynamo's frame
entry and guards, AOTAutograd's runtime wrappers, the autograd engine and the
optimizer's Python. Printed: its time per step (with a wait for the loss) beside
the ``jax.jit`` step's, and the *ideal backend*: each step runs that host work
and then dispatches the ``jax.jit`` step itself, a backend that costs nothing
and whose program is exactly the hand-written one. Its ratio to the ``jax.jit``
step alone, per step (each step waited for) and pipelined (blocks of
``PIPELINE`` steps, one wait; the host's work can then overlap the device's),
is the best ratio a torch.compile backend can reach here: a target below it
asks for less host work than torch itself does. All timings interleaved, in
one process, with the suite's thread settings (one compute thread).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time

from benchmarks import settings
from benchmarks.settings import PIPELINE


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


def null_workload(factory, kwargs: dict):
    """The workload on CPU with its forward (+ backward) and optimizer step under the null backend."""
    import torch  # noqa: PLC0415

    workload = factory("cpu", **kwargs)
    workload.compile(functools.partial(torch.compile, backend=null_backend), optimizer=True)
    return workload


def ideal_step(workload, jw):
    """One step of the ideal backend: ``workload``'s host work (under the null backend), then
    ``jw``'s ``jax.jit`` step as its program; returns that step's loss."""

    def step():
        workload.step()
        return jw.step()

    return step


def measure(name: str, steps: int, small: bool = False) -> dict:

    import lazytpu  # noqa: F401, PLC0415 (JAX configured as the suite has it: x64 on)
    from benchmarks import jax_workloads as J  # noqa: PLC0415
    from benchmarks.workloads import SMALL_SIZES, WORKLOADS  # noqa: PLC0415

    factory, kwargs, _ = WORKLOADS[name]
    kwargs = SMALL_SIZES[name] if small else kwargs
    workload = null_workload(factory, kwargs)
    init = factory("cpu", **kwargs).init_state
    jw, ideal_jw = J.BUILDERS[name](init), J.BUILDERS[name](init)
    steppers = {"null": workload.step, "jax": jw.step, "ideal": ideal_step(workload, ideal_jw)}
    waits = {"null": lambda loss: loss.item(), "jax": lambda _: jw.wait(), "ideal": lambda _: ideal_jw.wait()}
    for _ in range(10):
        for key, step in steppers.items():
            waits[key](step())
    times: dict[str, list[float]] = {k: [] for k in steppers}
    blocks: dict[str, list[float]] = {"jax": [], "ideal": []}
    for i in range(steps):
        for key, step in steppers.items():
            start = time.perf_counter()
            waits[key](step())
            times[key].append(time.perf_counter() - start)
        if i % PIPELINE == 0:  # a pipelined block of each, interleaved the same way
            for key in blocks:
                start = time.perf_counter()
                for _ in range(PIPELINE):
                    out = steppers[key]()
                waits[key](out)
                blocks[key].append(time.perf_counter() - start)
    null_ms, jax_ms = statistics.median(times["null"]) * 1e3, statistics.median(times["jax"]) * 1e3
    return {
        "workload": name,
        "null_ms": null_ms,
        "jax_ms": jax_ms,
        "ideal_ratio": statistics.median(a / b for a, b in zip(times["ideal"], times["jax"])),
        "ideal_pipelined_ratio": statistics.median(a / b for a, b in zip(blocks["ideal"], blocks["jax"])),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.floor", description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="mlp_b32,mlp_b256,transformer")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="tiny sizes (a smoke test, not a measurement)")
    args = parser.parse_args(argv)
    settings.configure_environment(args.threads)
    print(f"{'workload':<12} {'null backend':>13} {'jax.jit step':>13} {'ideal/jax.jit':>14} {'pipelined':>10}")
    for name in args.workloads.split(","):
        r = measure(name, args.steps, args.small)
        print(
            f"{name:<12} {r['null_ms']:>10.3f} ms {r['jax_ms']:>10.3f} ms "
            f"{r['ideal_ratio']:>14.3f} {r['ideal_pipelined_ratio']:>10.3f}"
        )
    print(
        "null backend: torch.compile's own host time per step (graphs compute nothing); "
        "ideal: that host work plus the jax.jit step as the program (a backend that costs nothing), "
        f"over the jax.jit step, per step with its wait and pipelined ({PIPELINE} steps per wait)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
