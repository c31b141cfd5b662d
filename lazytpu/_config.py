"""Typed flags, read from the environment once, usable as ``with`` blocks.

Note [Env table]: every environment variable lazytpu reads is declared
here, in ``FLAGS``; the docs' table is checked against it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _parse_bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r}: expected one of {', '.join(_TRUE + _FALSE)}")


def _parse_positive_int(name: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"{name}={raw!r}: expected a positive integer")
    return value


def _parse_choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        low = raw.strip().lower()
        if low not in choices:
            raise ValueError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
        return low

    return parse


def _parse_items(*choices: str) -> Callable[[str, str], frozenset]:
    def parse(name: str, raw: str) -> frozenset:
        items = frozenset(p.strip() for p in raw.split(",") if p.strip())
        unknown = sorted(items - set(choices))
        if unknown:
            raise ValueError(
                f"{name}={raw!r}: unknown item {', '.join(map(repr, unknown))}; "
                f"expected a comma-separated list of {', '.join(choices)}"
            )
        return items

    return parse


def _parse_dir(name: str, raw: str) -> str:
    """A directory path (``~`` expanded); it or its nearest existing ancestor must be a directory."""
    path = existing = Path(raw).expanduser()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{name}={raw!r}: expected a directory path ({existing} is not a directory)")
    return str(path)


CACHE_OFF = ("off", "0", "none", "false")


def _parse_cache_dir(name: str, raw: str) -> str:
    if raw.strip().lower() in CACHE_OFF:
        return raw
    try:
        return _parse_dir(name, raw)
    except ValueError as exc:
        raise ValueError(f"{exc}, or one of {', '.join(CACHE_OFF)} to disable the cache") from None


@attrs.define(slots=True)
class Flag:
    """One setting: its env var, default, parser and current value."""

    env: str
    default: Any
    parse: Callable[[str, str], Any]
    doc: str
    value: Any = None

    def load(self) -> None:
        raw = os.environ.get(self.env)
        self.value = self.default if raw is None or raw == "" else self.parse(self.env, raw)

    def get(self) -> Any:
        return self.value

    @contextlib.contextmanager
    def override(self, value: Any) -> Iterator[None]:
        old, self.value = self.value, value
        try:
            yield
        finally:
            self.value = old


_lock = threading.Lock()

CPU_FALLBACK = Flag(
    "LAZYTPU_CPU_FALLBACK", True, _parse_bool, "Run ops with no lowering on CPU torch (0: raise NotImplementedError)."
)
PLATFORMS = ("tpu", "gpu", "cpu")  # LAZYTPU_PLATFORM's values, best first
PLATFORM = Flag(
    "LAZYTPU_PLATFORM",
    None,
    _parse_choice(*PLATFORMS),
    "PJRT platform: tpu, gpu or cpu (default: the best present).",
)
EAGER_MODE = Flag(
    "TORCHTPU_EAGER_MODE",
    None,
    lambda n, r: r.strip().lower(),
    "Execution mode at import: defer (default), strict or strict-blocking.",
)
DEFER_AND_FUSE = Flag(
    "TORCH_TPU_DEFER_AND_FUSE", None, _parse_bool, "TorchTPU's alias: 1 selects defer, 0 selects strict."
)

SYNC_ON_OPTIMIZER_STEP = Flag(
    "LAZYTPU_SYNC_ON_OPTIMIZER_STEP",
    True,
    _parse_bool,
    "End of optimizer.step() on tpu parameters is a sync point (0: off).",
)
STEP_SEGMENTS = Flag(
    "LAZYTPU_STEP_SEGMENTS",
    True,
    _parse_bool,
    "Defer mode dispatches a step in segments, at the start of each backward pass and of "
    "optimizer.step(), so that the device runs while the host records (0: one program).",
)
GC_FREEZE = Flag(
    "LAZYTPU_GC_FREEZE",
    True,
    _parse_bool,
    "At import, move the objects that exist (torch's, JAX's) out of the garbage collector's "
    "full collections (gc.freeze; 0: off).",
)
MAX_PENDING_OPS = Flag(
    "LAZYTPU_MAX_PENDING_OPS",
    20000,
    _parse_positive_int,
    "Sync when this many ops are pending (bounds memory in loops that never sync).",
)
MAX_PENDING_DEPTH = Flag(
    "LAZYTPU_MAX_PENDING_DEPTH",
    500,
    _parse_positive_int,
    "Sync when a pending op is this many dependent ops deep (bounds compile time: XLA's grows "
    "faster than linearly with a program's depth).",
)

CACHE_DIR = Flag(
    "LAZYTPU_CACHE_DIR",
    None,
    _parse_cache_dir,
    "Directory of the persistent compile cache (default ~/.cache/lazytpu; 'off' disables).",
)
PROGRAM_CACHE_SIZE = Flag(
    "LAZYTPU_PROGRAM_CACHE_SIZE",
    256,
    _parse_positive_int,
    "Compiled programs kept in memory, least recently used evicted first (at least 1).",
)

VALUE_CHECKS = Flag(
    "LAZYTPU_VALUE_CHECKS",
    True,
    _parse_bool,
    "Check the values torch checks (indices, targets, probabilities, divisors) inside programs (0: off).",
)

DEBUG_ITEMS = ("bounds", "recompile")
DEBUG = Flag(
    "LAZYTPU_DEBUG",
    frozenset(),
    _parse_items(*DEBUG_ITEMS),
    "Comma list: 'recompile' logs why each recompile happened to stderr; 'bounds' checks index tensors.",
)
DUMP_DIR = Flag(
    "LAZYTPU_DUMP_DIR",
    None,
    _parse_dir,
    "Write each compiled program's IR and StableHLO text here, named by its key.",
)

FLAGS: tuple[Flag, ...] = (
    CPU_FALLBACK,
    PLATFORM,
    EAGER_MODE,
    DEFER_AND_FUSE,
    SYNC_ON_OPTIMIZER_STEP,
    STEP_SEGMENTS,
    GC_FREEZE,
    MAX_PENDING_OPS,
    MAX_PENDING_DEPTH,
    CACHE_DIR,
    PROGRAM_CACHE_SIZE,
    VALUE_CHECKS,
    DEBUG,
    DUMP_DIR,
)


def load_all() -> None:
    """(Re)read every flag from the environment."""
    with _lock:
        for flag in FLAGS:
            flag.load()


load_all()
