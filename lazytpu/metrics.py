"""Counters that explain what lazytpu did: ops, syncs, compiles, transfers.

>>> import lazytpu
>>> lazytpu.metrics.reset()
>>> ...  # run some tpu code
>>> lazytpu.metrics.snapshot()["programs_compiled"]
>>> print(lazytpu.metrics.report())
"""

from __future__ import annotations

import collections
import copy
import threading
from typing import Any

__all__ = ["snapshot", "reset", "report"]

_COUNTERS = (
    "ops_recorded",
    "programs_compiled",
    "programs_executed",
    "cache_hits",
    "cache_misses",
    "programs_evicted",
    "disk_cache_hits",
    "disk_cache_misses",
    "bytes_to_device",
    "bytes_from_device",
    "constant_reads",
)
_TIMERS = ("compile_seconds", "execute_seconds")
_BY_KEY = ("syncs", "cpu_fallbacks", "recompile_reasons")


class _Metrics:
    """The one process-wide owner of every counter (locked: autograd records
    from its own thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.values: dict[str, Any] = dict.fromkeys(_COUNTERS, 0)
        self.values.update(dict.fromkeys(_TIMERS, 0.0))
        for name in _BY_KEY:
            self.values[name] = collections.Counter()

    def add(self, name: str, amount: float = 1) -> None:
        with self.lock:
            self.values[name] += amount

    def count(self, name: str, key: str) -> None:
        with self.lock:
            self.values[name][key] += 1


_METRICS = _Metrics()
add = _METRICS.add
count = _METRICS.count
_FOLDERS: list = []


def register_folder(fold) -> None:
    """``fold()`` adds counts kept elsewhere (per-op counters kept without
    this lock) into the metrics; snapshot and reset call it first."""
    _FOLDERS.append(fold)


def snapshot() -> dict[str, Any]:
    """A copy of every counter.

    Returns:
        A dict with ``ops_recorded``, ``syncs`` (a dict by reason),
        ``programs_compiled``, ``programs_executed``, ``cache_hits``,
        ``cache_misses``, ``programs_evicted``, ``cpu_fallbacks`` (a dict by op), ``compile_seconds``,
        ``execute_seconds``, ``bytes_to_device`` and ``bytes_from_device``.
    """
    for fold in _FOLDERS:
        fold()
    with _METRICS.lock:
        out = copy.deepcopy(_METRICS.values)
    for name in _BY_KEY:
        out[name] = dict(out[name])
    return out


def reset() -> None:
    """Set every counter back to zero."""
    for fold in _FOLDERS:
        fold()
    with _METRICS.lock:
        _METRICS.reset()


def report() -> str:
    """A readable text table of every counter."""
    snap = snapshot()
    rows = [(name, snap[name]) for name in _COUNTERS]
    rows += [(name, f"{snap[name]:.4f}") for name in _TIMERS]
    for name in _BY_KEY:
        total = sum(snap[name].values())
        rows.append((name, total))
        rows += [(f"  {key}", n) for key, n in sorted(snap[name].items(), key=lambda kv: -kv[1])]
    width = max(len(r[0]) for r in rows)
    lines = ["lazytpu metrics", "-" * (width + 14)]
    lines += [f"{name:<{width}}  {value:>12}" for name, value in rows]
    return "\n".join(lines)
