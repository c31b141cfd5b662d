"""Soak: a long defer-mode training loop must hold flat.

    python examples/soak.py [STEPS]     (make soak runs 2000 steps)

Prints resident memory after warm-up and at the end, the growth, the pending
graph and cache sizes, and the programs compiled after warm-up; exits
non-zero if memory grows by 5% or more, anything compiles after warm-up, or
the caches grow.
"""

from __future__ import annotations

import gc
import os
import sys

import torch
import torch.nn.functional as F

import lazytpu
from lazytpu import engine, runtime


def rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def soak(steps: int, warmup: int = 50) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 10)).to("tpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    gen = torch.Generator().manual_seed(0)
    data = [(torch.randn(32, 64, generator=gen), torch.randint(0, 10, (32,), generator=gen)) for _ in range(8)]
    graph = engine.context(0).graph
    figures = {}
    for step in range(steps):
        x, y = data[step % len(data)]
        opt.zero_grad()
        loss = F.cross_entropy(model(x.to("tpu")), y.to("tpu"))
        loss.backward()
        opt.step()
        sched.step()
        if step % 10 == 0:
            loss.item()
        if step == warmup - 1:
            gc.collect()
            torch.tpu.synchronize()
            figures["rss_warm"] = rss_bytes()
            figures["compiled_warm"] = lazytpu.metrics.snapshot()["programs_compiled"]
            figures["cache_warm"] = runtime.cache_info()["entries"]
        figures["max_pending_ops"] = max(figures.get("max_pending_ops", 0), graph.pending_ops)
        figures["max_tracked"] = max(figures.get("max_tracked", 0), len(graph.storages))
    gc.collect()
    torch.tpu.synchronize()
    figures["rss_end"] = rss_bytes()
    figures["compiled_after_warmup"] = lazytpu.metrics.snapshot()["programs_compiled"] - figures["compiled_warm"]
    figures["cache_growth"] = runtime.cache_info()["entries"] - figures["cache_warm"]
    figures["rss_growth"] = figures["rss_end"] / figures["rss_warm"] - 1
    figures["steps"] = steps
    return figures


def main() -> int:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    f = soak(steps)
    print(f"soak: {f['steps']} steps in defer mode")
    print(
        f"  resident memory after warm-up {f['rss_warm'] / 2**20:.1f} MiB, at the end {f['rss_end'] / 2**20:.1f} MiB "
        f"({100 * f['rss_growth']:+.2f}%)"
    )
    print(f"  programs compiled after warm-up: {f['compiled_after_warmup']}; program-cache growth: {f['cache_growth']}")
    print(f"  largest pending graph: {f['max_pending_ops']} ops; most tracked storages: {f['max_tracked']}")
    ok = f["rss_growth"] < 0.05 and f["compiled_after_warmup"] == 0 and f["cache_growth"] == 0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
