"""Host cost of one steady-state defer step, per workload (issue 5).

    python -m benchmarks.steps [--workloads mlp_b32,transformer] [--steps 40]

For each training workload in defer mode: the main thread's CPU time per
step (``time.thread_time()`` around ``step()`` and the ``.item()`` that waits
for it: XLA runs the program on its own threads, which this does not count),
recorded nodes and programs per step. What the host spends is what defer
adds to the program's own time; the hand-written ``jax.jit`` step spends
almost none.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import lazytpu
from benchmarks.workloads import WORKLOADS

TRAINING = ("mlp_b32", "mlp_b256", "chain", "transformer")


def measure(name: str, steps: int, warmup: int = 5) -> dict:
    factory, kwargs, _ = WORKLOADS[name]
    workload = factory("tpu", **kwargs)
    for _ in range(warmup):
        workload.step().item()
    lazytpu.metrics.reset()
    times = []
    for _ in range(steps):
        start = time.thread_time()
        workload.step().item()
        times.append(time.thread_time() - start)
    snap = lazytpu.metrics.snapshot()
    return {
        "workload": name,
        "host_cpu_ms": statistics.median(times) * 1e3,
        "nodes_per_step": snap["ops_recorded"] / steps,
        "programs_per_step": snap["programs_executed"] / steps,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(TRAINING))
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'workload':<12} {'host CPU/step':>14} {'nodes/step':>11} {'programs/step':>14}")
    for name in args.workloads.split(","):
        r = measure(name, args.steps)
        print(f"{name:<12} {r['host_cpu_ms']:>11.2f} ms {r['nodes_per_step']:>11.0f} {r['programs_per_step']:>14.1f}")


if __name__ == "__main__":
    main()
