"""Command line and process environment of the suite (imports neither torch nor JAX).

Note [Equal threads]: every variant runs in this one process
with the same number of compute threads ``N`` (``--threads``, default 1):

- PyTorch CPU eager and torch.compile (inductor's OpenMP kernels):
  ``OMP_NUM_THREADS=MKL_NUM_THREADS=N`` before import, ``torch.set_num_threads(N)``,
  ``torch.set_num_interop_threads(1)``;
- XLA:CPU (lazytpu and the hand-written JAX, one shared PJRT client): its
  intra-op Eigen pool is sized by ``NPROC=N``; with ``N == 1`` also
  ``XLA_FLAGS=--xla_cpu_multi_thread_eigen=false``.

The default is one thread because the reference machine has 2 cores shared
with other jobs: with 2 threads each, OpenMP's spinning barriers in CPU eager
collapse under oversubscription (10-30x slower steps at load 7), which would
measure the machine, not the frameworks. ``--threads 0`` uses every core
this process may run on.

Compile caches: lazytpu's on-disk program cache and inductor's cache get a
fresh temporary directory per run (removed at exit), so first-step times
include real compiles; ``--warm-cache`` keeps the user's caches instead. JAX's
persistent cache is off by default and left off.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import sys
import tempfile

PIPELINE = 10  # steps per wait in the pipelined measurement (Note [Pipelined steady state])
VARIANTS = ("defer", "defer_whole", "strict", "cpu", "compile", "tpu_compile", "jax", "ideal", "subclass")
EXTRA_VARIANTS = ("tpu_compile_whole",)  # on request only (--variants), not in the default run
WORKLOAD_NAMES = ("mlp_b32", "mlp_b256", "chain", "transformer", "llama", "gpt2", "bert", "record")
SEPARATE = ("generate",)  # workloads with a module and measures of their own, run alone (benchmarks.generate)
DEFAULT_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="lazytpu benchmark suite: every workload under every variant, interleaved, in one process.",
    )
    p.add_argument("--steps", type=int, default=50, help="steady-state steps timed per variant (>= 20 for results)")
    p.add_argument("--warmup", type=int, default=3, help="steps run before timing (step 0 is the first-step time)")
    p.add_argument("--threads", type=int, default=1, help="compute threads for every variant (0: all cores)")
    p.add_argument(
        "--workloads", default=",".join(WORKLOAD_NAMES), help="comma list of " + ", ".join(WORKLOAD_NAMES + SEPARATE)
    )
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help="comma list of " + ", ".join(VARIANTS + EXTRA_VARIANTS)
    )
    p.add_argument(
        "--pipeline",
        type=int,
        default=PIPELINE,
        help="steps per wait in the pipelined measurement of the optimizer workloads (0: skip it)",
    )
    p.add_argument(
        "--pipeline-rounds", type=int, default=8, help="pipelined blocks timed per variant (after one warm-up)"
    )
    p.add_argument("--record-ops", type=int, default=256, help="ops per timed batch in the recording benchmark")
    p.add_argument("--small", action="store_true", help="tiny sizes (a smoke test of the suite, not a measurement)")
    p.add_argument("--out", default=DEFAULT_RESULTS, help="directory for results.json and results.png")
    p.add_argument("--no-chart", action="store_true", help="skip the PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--warm-cache", action="store_true", help="use the persistent compile caches instead of fresh ones")
    args = p.parse_args(argv)
    args.workloads = [w for w in args.workloads.split(",") if w]
    args.variants = [v for v in args.variants.split(",") if v]
    for w in args.workloads:
        if w not in WORKLOAD_NAMES + SEPARATE:
            p.error(f"unknown workload {w!r}: expected one of {', '.join(WORKLOAD_NAMES + SEPARATE)}")
    if any(w in SEPARATE for w in args.workloads) and len(args.workloads) > 1:
        p.error(f"{', '.join(SEPARATE)} runs alone: --workloads generate")
    for v in args.variants:
        if v not in VARIANTS + EXTRA_VARIANTS:
            p.error(f"unknown variant {v!r}: expected one of {', '.join(VARIANTS + EXTRA_VARIANTS)}")
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be at least 1")
    if args.pipeline < 0 or args.pipeline_rounds < 1:
        p.error("--pipeline must be >= 0 and --pipeline-rounds >= 1")
    return args


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def configure_environment(threads: int, *, warm_cache: bool = False) -> dict:
    """Set the thread and cache environment; returns what was set (recorded in the JSON).

    Must run before torch, JAX or lazytpu is imported (warns if too late).
    """
    n = threads if threads > 0 else _cores()
    late = [m for m in ("torch", "jax", "lazytpu") if m in sys.modules]
    if late:
        print(
            f"benchmarks: warning: {', '.join(late)} already imported; thread settings may not apply", file=sys.stderr
        )
    env = {"OMP_NUM_THREADS": str(n), "MKL_NUM_THREADS": str(n), "NPROC": str(n)}
    xla_flags = os.environ.get("XLA_FLAGS", "")
    if n == 1 and "xla_cpu_multi_thread_eigen" not in xla_flags:
        xla_flags = (xla_flags + " --xla_cpu_multi_thread_eigen=false").strip()
    if xla_flags:
        env["XLA_FLAGS"] = xla_flags
    if not warm_cache:
        tmp = tempfile.mkdtemp(prefix="lazytpu-bench-")
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
        env["LAZYTPU_CACHE_DIR"] = os.path.join(tmp, "lazytpu")
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tmp, "inductor")
    os.environ.update(env)
    return {"threads": n, "cores_available": _cores(), "env": env}
