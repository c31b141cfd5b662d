"""lazytpu.metrics: snapshot, reset, report."""

from __future__ import annotations

import torch

import lazytpu

KEYS = {
    "ops_recorded",
    "syncs",
    "programs_compiled",
    "programs_executed",
    "cache_hits",
    "cache_misses",
    "cpu_fallbacks",
    "compile_seconds",
    "execute_seconds",
    "bytes_to_device",
    "bytes_from_device",
}


def test_snapshot_counts_a_run():
    lazytpu.metrics.reset()
    x = torch.ones(10, dtype=torch.float32).to("tpu")
    y = (x + 1) * 2.5
    y.cpu()
    snap = lazytpu.metrics.snapshot()
    assert KEYS <= set(snap)
    assert snap["ops_recorded"] >= 2
    assert snap["programs_executed"] == 1
    assert snap["cache_hits"] + snap["cache_misses"] == 1
    assert snap["bytes_to_device"] >= 40 and snap["bytes_from_device"] == 40
    assert snap["syncs"] == {"cpu": 1}
    assert snap["execute_seconds"] > 0
    if snap["cache_misses"]:
        assert snap["programs_compiled"] == 1 and snap["compile_seconds"] > 0


def test_reset_and_report():
    (torch.ones(3).to("tpu") + 1).cpu()
    text = lazytpu.metrics.report()
    for key in KEYS:
        assert key in text
    lazytpu.metrics.reset()
    snap = lazytpu.metrics.snapshot()
    assert snap["ops_recorded"] == 0 and snap["syncs"] == {} and snap["cpu_fallbacks"] == {}


def test_snapshot_is_a_copy():
    snap = lazytpu.metrics.snapshot()
    snap["syncs"]["bogus"] = 1
    assert "bogus" not in lazytpu.metrics.snapshot()["syncs"]
