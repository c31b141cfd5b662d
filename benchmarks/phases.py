"""A training step's wall time by phase: lazytpu against the forwarding floor and CPU torch.

    python -m benchmarks.phases [--workloads llama,gpt2,bert] [--steps 60] [--variants defer,subclass,cpu]

Each workload is built once per variant (``defer``: lazytpu on ``tpu``;
``subclass``: the forwarding floor, Note [Forwarding floor] in
``benchmarks.subclass``; ``strict``: lazytpu op by op; ``cpu``: CPU torch,
threads = 1); steps alternate between the variants, in an order that turns
around at every step, each step with the ``.item()`` of its loss. A step's
wall time is split at four marks, set by hooks that every variant runs alike:

- ``forward``: ``zero_grad`` and the model's forward, up to its forward hook
  (the transformers models compute their loss inside it);
- ``backward``: from there to the optimizer's step pre-hook: ``backward()``
  (and lazytpu's dispatch of the forward's program at its first backward op,
  then of the backward's at ``optimizer.step()``: Note [Step segments] in
  lazytpu/engine.py);
- ``optimizer``: ``optimizer.step()`` itself;
- ``read``: the rest of the step: the loss's ``.item()``, which on lazytpu
  dispatches the optimizer's program (Note [Step boundary]) and waits for the
  loss.

The forwarding floor does each op's compute on the host, inside the phase
that records it; lazytpu records the op there and computes it on the device.
A phase where ``defer/subclass`` is at most 1 costs no more host time than the
floor of any ``__torch_dispatch__`` backend plus CPU torch's kernels; the
medians per phase and their ratios show where lazytpu's own time is.
"""

from __future__ import annotations

import argparse
import statistics
import time

from benchmarks import settings

# the device each variant's workload is built on ("subclass": benchmarks.subclass.DEVICE)
VARIANTS = {"defer": "tpu", "strict": "tpu", "subclass": "subclass", "cpu": "cpu"}
PHASES = ("forward", "backward", "optimizer", "read")


class _Marks:
    """The times of a step's marks, set by the forward and optimizer hooks ``measure`` registers."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def mark(self, *_args) -> None:
        self.times.append(time.perf_counter())


def _timed_step(workload, marks: _Marks, mode: str) -> list[float]:
    """One step of ``workload``: the wall seconds of each of ``PHASES``."""
    import torch

    with torch.tpu.set_eager_mode("strict" if mode == "strict" else "defer"):
        marks.times = []
        start = time.perf_counter()
        workload.step().item()
        end = time.perf_counter()
    if len(marks.times) != 3:
        raise RuntimeError(f"{workload.name}: a step did not run its forward hook and optimizer step once each")
    points = [start, *marks.times, end]
    return [b - a for a, b in zip(points, points[1:])]


def measure(name: str, variants: list[str], steps: int, warmup: int = 6) -> dict:
    """Median seconds per phase of ``steps`` steps of workload ``name`` for each variant."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    import lazytpu  # noqa: F401  (the tpu device)
    from benchmarks.workloads import WORKLOADS

    make, options, _ = WORKLOADS[name]
    built = {v: make(VARIANTS[v], **options) for v in variants}
    marks = _Marks()
    handles = [w.model.register_forward_hook(marks.mark) for w in built.values()]
    handles += [register_optimizer_step_pre_hook(marks.mark), register_optimizer_step_post_hook(marks.mark)]
    runs: dict[str, list] = {v: [] for v in variants}
    try:
        for i in range(warmup + steps):
            for v in variants if i % 2 else variants[::-1]:
                phases = _timed_step(built[v], marks, v)
                if i >= warmup:
                    runs[v].append(phases)
    finally:
        for handle in handles:
            handle.remove()
    return {v: [statistics.median(p[k] for p in times) for k in range(len(PHASES))] for v, times in runs.items()}


def format_table(name: str, medians: dict) -> list[str]:
    """Rows of ms per phase for each variant, then lazytpu's ratios to the floor and to CPU."""
    lines = [f"{name:<10} {'variant':<15}" + "".join(f" {p:>9}" for p in PHASES) + f" {'step':>9}"]
    for v, ms in medians.items():
        lines.append(f"{'':<10} {v:<15}" + "".join(f" {t * 1e3:>9.3f}" for t in ms) + f" {sum(ms) * 1e3:>9.3f}")
    for ours in ("defer", "strict"):
        for base in ("subclass", "cpu"):
            if ours in medians and base in medians:
                pairs = list(zip(medians[ours], medians[base])) + [(sum(medians[ours]), sum(medians[base]))]
                ratios = "".join(f" {a / b:>9.2f}" if b > 0 else f" {'-':>9}" for a, b in pairs)
                lines.append(f"{'':<10} {ours + '/' + base:<15}{ratios}")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="llama,gpt2,bert")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--variants", default="defer,subclass,cpu")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
    settings.configure_environment(1)
    print(f"ms per phase, medians of {args.steps} interleaved steps (wall clock); ratios per phase and for the step")
    for name in args.workloads.split(","):
        for line in format_table(name, measure(name, variants, args.steps)):
            print(line, flush=True)


if __name__ == "__main__":
    main()
