"""The cost of value checks per training step (Note [Value checks]; issue 19 item 3).

    python -m benchmarks.checks [--workloads mlp_b32,transformer] [--steps 60]

Each workload runs in defer mode, one step with the checks on and one with
them off (``LAZYTPU_VALUE_CHECKS``), alternating, in one process; each step
reads its loss (``.item()``), as a training loop that logs it does. Reported:
the median wall time per step either way and their ratio (the target is at
most 1.03), and the main thread's CPU time per step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.workloads import WORKLOADS
from lazytpu import _config

TRAINING = ("mlp_b32", "transformer")


def measure(name: str, steps: int, warmup: int = 5) -> dict:
    factory, kwargs, _ = WORKLOADS[name]
    workload = factory("tpu", **kwargs)
    wall: dict[bool, list] = {True: [], False: []}
    host: dict[bool, list] = {True: [], False: []}
    for i in range(2 * (warmup + steps)):
        on = i % 2 == 0
        with _config.VALUE_CHECKS.override(on):
            start, cpu = time.perf_counter(), time.thread_time()
            workload.step().item()
            if i >= 2 * warmup:
                wall[on].append(time.perf_counter() - start)
                host[on].append(time.thread_time() - cpu)
    med = {k: statistics.median(v) * 1e3 for k, v in wall.items()}
    return {
        "workload": name,
        "on_ms": med[True],
        "off_ms": med[False],
        "ratio": med[True] / med[False],
        "host_on_ms": statistics.median(host[True]) * 1e3,
        "host_off_ms": statistics.median(host[False]) * 1e3,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(TRAINING))
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'workload':<12} {'checks on':>10} {'off':>9} {'on/off':>7} {'host CPU on':>12} {'off':>9}")
    for name in args.workloads.split(","):
        r = measure(name, args.steps)
        print(
            f"{name:<12} {r['on_ms']:>7.2f} ms {r['off_ms']:>6.2f} ms {r['ratio']:>7.3f} "
            f"{r['host_on_ms']:>9.2f} ms {r['host_off_ms']:>6.2f} ms"
        )


if __name__ == "__main__":
    main()
