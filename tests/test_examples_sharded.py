"""The sharding examples and the FSDP2-vs-DDP benchmark's report (issue 24 items 6 and 7)."""

from __future__ import annotations

import os
import sys

from dist_harness import launch, report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repo root, where the benchmarks package lives

from benchmarks import distributed  # noqa: E402


def test_fsdp_example_matches_cpu_training_and_shards_memory():
    """examples/fsdp_train.py on 2 ranks: the sharded model ends equal to CPU training on
    the whole batch, and each rank holds about half of the parameters and AdamW state."""
    results = launch(os.path.join(ROOT, "examples", "fsdp_train.py"), "", world=2, timeout=240)
    out = "".join(text for _, text in results)
    assert all(code == 0 for code, _ in results), report(results)
    assert "parameters equal to CPU training on the whole batch: True" in out, report(results)
    for rank in (0, 1):
        (line,) = [line for line in out.splitlines() if line.startswith(f"[rank {rank}] holds ")]
        share = float(line.split()[3])
        assert 0.45 <= share <= 0.6, line


def test_distributed_benchmark_report():
    """benchmarks.distributed's table from two ranks' results: medians, held memory, ratios."""

    def rank(r, ddp_ms, fsdp_ms, ddp_mem, fsdp_mem):
        return dict(
            rank=r,
            world=2,
            times={"ddp": [t / 1e3 for t in ddp_ms], "fsdp2": [t / 1e3 for t in fsdp_ms]},
            memory={"ddp": ddp_mem, "fsdp2": fsdp_mem},
            peak={"ddp": 2**20, "fsdp2": 2**21},
            programs={"ddp": [3, 3, 3], "fsdp2": [3, 3, 3]},
            compiles={"ddp": 0, "fsdp2": 0},
            losses={"ddp": [2.0, 1.5], "fsdp2": [2.0, 1.5]},
        )

    text = distributed.report(
        [rank(0, [10, 20, 30], [20, 40, 60], 8 * 2**20, 4 * 2**20), rank(1, [10] * 3, [15] * 3, 8 * 2**20, 4 * 2**20)]
    )
    lines = text.splitlines()
    ddp = next(line for line in lines if line.startswith("ddp "))
    assert ddp.split()[1] == "10.00" and ddp.split()[3] == "8.000", ddp
    assert "fsdp2/ddp step time (median of per-round ratios, per rank): 2.00, 1.50" in text
    assert "fsdp2/ddp memory held per rank: 0.50" in text
    assert "losses of the two variants equal on every rank and step: True" in text
