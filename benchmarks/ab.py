"""One lazytpu mechanism on and off, on the same workload, interleaved in one process.

    python -m benchmarks.ab --switch constant_reads [--workloads llama,gpt2] [--steps 120]

Two copies of each training workload on ``tpu`` (defer mode, threads = 1),
built alike; copy A runs with the mechanism, copy B without it. Steps
alternate A, B and B, A, each step with the ``.item()`` of its loss, after a
warm-up of both; the report gives the median step of each (wall clock and
process CPU, all threads) and the ratio off/on: above 1, the mechanism saves
time. Both copies share the process's caches and its noise, which is what
makes a few percent measurable on a shared machine. The switches:

- ``constant_reads``: Note [Constant reads] in ``lazytpu/engine_flush.py``
  (off: every host read of a pending value flushes its lane);
- ``segments``: Note [Step segments] in ``lazytpu/engine.py`` (off: one
  program per step, ``LAZYTPU_STEP_SEGMENTS=0``).

A switch is a context manager around one step: a measurement tool's view of
internals, not an API.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

from benchmarks import settings


@contextlib.contextmanager
def _constant_reads_off():
    from lazytpu import engine_flush  # noqa: PLC0415

    real = engine_flush.constant_value
    engine_flush.constant_value = lambda ctx, lane, storage: None
    try:
        yield
    finally:
        engine_flush.constant_value = real


def _segments_off():
    from lazytpu import _config  # noqa: PLC0415

    return _config.STEP_SEGMENTS.override(False)


SWITCHES = {"constant_reads": _constant_reads_off, "segments": _segments_off}


def _timed(step, off=None) -> tuple[float, float]:
    """(wall, process CPU) seconds of one step and the read of its loss."""
    with off() if off is not None else contextlib.nullcontext():
        wall, cpu = time.perf_counter(), time.process_time()
        step().item()
        return time.perf_counter() - wall, time.process_time() - cpu


def measure(name: str, switch: str, steps: int, warmup: int = 8) -> dict:
    """Medians of ``steps`` steps of workload ``name`` with ``switch`` on and off."""
    import torch  # noqa: PLC0415

    import lazytpu  # noqa: F401, PLC0415  (the tpu device)
    from benchmarks.workloads import WORKLOADS  # noqa: PLC0415

    torch.set_num_threads(1)
    make, options, _ = WORKLOADS[name]
    on, off = make("tpu", **options), make("tpu", **options)
    turned_off = SWITCHES[switch]
    for _ in range(warmup):
        _timed(on.step), _timed(off.step, turned_off)
    runs: dict[str, list] = {"on": [], "off": []}
    for i in range(steps):
        order = (("on", on, None), ("off", off, turned_off))
        for label, workload, how in order if i % 2 else order[::-1]:
            runs[label].append(_timed(workload.step, how))
    out = {"workload": name, "switch": switch, "steps": steps}
    for label, times in runs.items():
        out[f"{label}_wall_ms"] = statistics.median(t[0] for t in times) * 1e3
        out[f"{label}_cpu_ms"] = statistics.median(t[1] for t in times) * 1e3
    out["off_over_on_wall"] = out["off_wall_ms"] / out["on_wall_ms"]
    out["off_over_on_cpu"] = out["off_cpu_ms"] / out["on_cpu_ms"]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switch", required=True, choices=sorted(SWITCHES))
    parser.add_argument("--workloads", default="llama,gpt2")
    parser.add_argument("--steps", type=int, default=120)
    args = parser.parse_args(argv)
    settings.configure_environment(1)
    print(f"{args.switch} on and off, medians of {args.steps} interleaved steps (ms; CPU: the process, all threads)")
    print(f"{'workload':<12} {'on':>8} {'off':>8} {'off/on':>7} | {'on cpu':>8} {'off cpu':>8} {'off/on':>7}")
    for name in args.workloads.split(","):
        r = measure(name, args.switch, args.steps)
        print(
            f"{name:<12} {r['on_wall_ms']:>8.2f} {r['off_wall_ms']:>8.2f} {r['off_over_on_wall']:>7.3f} |"
            f" {r['on_cpu_ms']:>8.2f} {r['off_cpu_ms']:>8.2f} {r['off_over_on_cpu']:>7.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
