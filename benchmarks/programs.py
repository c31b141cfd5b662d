"""A training step's programs alone: lazytpu's against the hand-written ``jax.jit`` step's.

    python -m benchmarks.programs [--workloads mlp_b32,mlp_b256,transformer] [--rounds 15] [--calls 30]

The suite's pipelined measurement (Note [Pipelined steady state] in
``benchmarks/runner.py``) times host and device together. This times the
device side alone. It runs the ``tpu_compile`` variant for a few pipelined
blocks (10 steps, then a wait) and keeps the step programs lazytpu compiled
and ran in the last block. There are two: the program of the steps whose
gradients the loop dropped before it was dispatched, and the program of the
block's last step, which the wait dispatches while ``.grad`` still holds its
gradients (Note [Step boundary] in ``lazytpu/engine.py``; the steps run
without step segments, as one program each). Each of them, and
the ``jax.jit`` step with and without returning its gradients, is compiled
again *without donation* and timed on fixed inputs: ``calls`` calls back to
back, then a wait, interleaved over ``rounds`` rounds; medians per call.

lazytpu's programs are taken from its runtime (``runtime.executor``'s
compile and run functions, wrapped while the blocks run): a measurement
tool's view of internals, not an API.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import time

from benchmarks import settings
from benchmarks.settings import PIPELINE

_TRAINING = ("mlp_b32", "mlp_b256", "transformer")


@contextlib.contextmanager
def _captured_programs():
    """Yield ``(programs, runs)``: every program compiled meanwhile, by key, as
    ``(fn, inputs)`` (arrays as shapes and dtypes), and the keys run, in order."""
    import jax  # noqa: PLC0415

    from lazytpu.runtime import executor  # noqa: PLC0415

    programs: dict = {}
    runs: list = []
    compile_, run_ = executor._compile, executor.run_program

    def compile_spy(key, fn, inputs, *args, **kwargs):
        specs = [jax.ShapeDtypeStruct(x.shape, x.dtype) if hasattr(x, "shape") else x for x in inputs]
        programs[key] = (fn, specs)
        return compile_(key, fn, inputs, *args, **kwargs)

    def run_spy(key, compile_fn, args, blocking=False, **counted):
        runs.append(key)
        return run_(key, compile_fn, args, blocking, **counted)

    executor._compile, executor.run_program = compile_spy, run_spy
    try:
        yield programs, runs
    finally:
        executor._compile, executor.run_program = compile_, run_


def _inputs(specs: list, seed: int) -> list:
    """Fixed inputs of the captured shapes: small normal floats, zero integers (valid class indices)."""
    import jax.numpy as jnp  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    out = []
    for s in specs:
        if not hasattr(s, "shape"):
            out.append(s)  # a lifted Python scalar
        elif np.issubdtype(s.dtype, np.floating):
            out.append(jnp.asarray((rng.standard_normal(s.shape) * 0.01).astype(s.dtype)))
        else:
            out.append(jnp.zeros(s.shape, s.dtype))
    return out


def measure(name: str, rounds: int, calls: int, small: bool = False) -> dict[str, float]:
    """Milliseconds per call of each step program of ``name``, timed alone."""
    import jax  # noqa: PLC0415
    import torch  # noqa: PLC0415

    import lazytpu  # noqa: PLC0415
    from benchmarks import jax_workloads as J  # noqa: PLC0415
    from benchmarks.workloads import SMALL_SIZES, WORKLOADS  # noqa: PLC0415

    factory, kwargs, _ = WORKLOADS[name]
    kwargs = SMALL_SIZES[name] if small else kwargs
    workload = factory("tpu", **kwargs)
    workload.compile(functools.partial(torch.compile, backend="tpu"), optimizer=True)
    # the step as one program, to set beside the jax.jit step (Note [Step segments] in lazytpu/engine.py)
    whole = lazytpu._config.STEP_SEGMENTS.override(False)
    with whole, _captured_programs() as (programs, runs):
        for _ in range(3):
            del runs[:]
            for _ in range(PIPELINE):
                loss = workload.step()
            loss.item()
            torch.tpu.synchronize()
    last_block = list(dict.fromkeys(runs))
    step_keys = sorted(last_block, key=runs.count, reverse=True)  # the dropped-gradients program first
    executables = {}
    for n, key in enumerate(step_keys):
        fn, specs = programs[key]
        outputs = len(jax.eval_shape(fn, *specs))
        label = f"lazytpu step ({runs.count(key)} of {len(runs)} in a block, {outputs} outputs)"
        args = _inputs(specs, n)
        executables[label] = (jax.jit(fn).lower(*args).compile(), args)
    init = factory("cpu", **kwargs).init_state
    for grads in (False, True):
        jw = J.BUILDERS[name](init, grads=grads)
        args = jw.args()
        label = "jax.jit step" + (" + its gradients" if grads else "")
        executables[label] = (jax.jit(jw.jitted.__wrapped__).lower(*args).compile(), list(args))
    times: dict[str, list[float]] = {k: [] for k in executables}
    for _ in range(rounds):
        for label, (executable, args) in executables.items():
            jax.block_until_ready(executable(*args))
            start = time.perf_counter()
            for _ in range(calls):
                out = executable(*args)
            jax.block_until_ready(out)
            times[label].append((time.perf_counter() - start) / calls)
    return {label: statistics.median(t) * 1e3 for label, t in times.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.programs", description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(_TRAINING))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="tiny sizes (a smoke test, not a measurement)")
    args = parser.parse_args(argv)
    settings.configure_environment(args.threads)
    for name in args.workloads.split(","):
        if name not in _TRAINING:
            parser.error(f"{name!r} is not a training workload: choose from {', '.join(_TRAINING)}")
        result = measure(name, args.rounds, args.calls, args.small)
        base = result["jax.jit step"]
        print(f"{name}: ms per call, and over the jax.jit step")
        for label, ms in result.items():
            print(f"  {label:<50} {ms:8.3f} ms {ms / base:6.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
