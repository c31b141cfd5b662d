"""A shorter soak (the full 2000 steps: `make soak`): flat memory, bounded
graph and caches, zero recompiles after warm-up."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from soak import soak  # noqa: E402


def test_short_soak_holds_flat():
    f = soak(400)
    assert f["compiled_after_warmup"] == 0
    assert f["cache_growth"] == 0
    assert f["max_pending_ops"] < 2000
    assert f["max_tracked"] < 5000
    assert f["rss_growth"] < 0.05, f
