"""lazytpu demo: train a small MLP on ``tpu`` in strict and in defer mode.

Run with ``make demo``. Prints the median step time of each mode, the
programs compiled, and the metrics report.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

import lazytpu

STEPS, WARMUP = 30, 5


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512), torch.nn.Linear(512, 10)
    )


def train(mode: str) -> dict:
    model = make_model().to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 256, generator=gen).to("tpu")
    y = torch.randint(0, 10, (64,), generator=gen).to("tpu")
    times, losses = [], []
    with torch.tpu.set_eager_mode(mode):
        lazytpu.metrics.reset()
        for step in range(STEPS):
            start = time.perf_counter()
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())  # a sync point: the step has run
            times.append(time.perf_counter() - start)
            if step == WARMUP - 1:
                compiled_in_warmup = lazytpu.metrics.snapshot()["programs_compiled"]
        snap = lazytpu.metrics.snapshot()
    return {
        "mode": mode,
        "first_step_s": times[0],
        "median_step_ms": 1e3 * statistics.median(times[WARMUP:]),
        "programs_compiled": snap["programs_compiled"],
        "compiled_after_warmup": snap["programs_compiled"] - compiled_in_warmup,
        "programs_per_step": snap["programs_executed"] / STEPS,
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "report": lazytpu.metrics.report(),
    }


def main() -> None:
    print(f"lazytpu {lazytpu.__version__} on {torch.tpu.get_device_name()}")
    results = [train("strict"), train("defer")]
    print()
    print(
        f"{'mode':<8} {'first step':>11} {'median step':>12} {'compiled':>9} {'after warm-up':>14} "
        f"{'programs/step':>14} {'loss':>16}"
    )
    for r in results:
        print(
            f"{r['mode']:<8} {r['first_step_s']:>10.2f}s {r['median_step_ms']:>10.2f}ms {r['programs_compiled']:>9} "
            f"{r['compiled_after_warmup']:>14} {r['programs_per_step']:>14.1f} "
            f"{r['loss_first']:>7.3f}->{r['loss_last']:.3f}"
        )
    strict, defer = results
    print(f"\ndefer is {strict['median_step_ms'] / defer['median_step_ms']:.1f}x faster than strict per step\n")
    print("metrics of the defer run:")
    print(defer["report"])


if __name__ == "__main__":
    main()
