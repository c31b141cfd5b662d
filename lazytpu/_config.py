"""Typed flags, read from the environment once, usable as ``with`` blocks.

Every environment variable lazytpu reads is declared here (Note [Env table]):
the docs' table is checked against ``FLAGS``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import attrs


def _parse_bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={raw!r}: expected one of 1, 0, true, false, on, off")


def _parse_int(name: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected an integer") from None


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
PLATFORM = Flag(
    "LAZYTPU_PLATFORM",
    None,
    lambda n, r: r.strip().lower(),
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
MAX_PENDING_OPS = Flag(
    "LAZYTPU_MAX_PENDING_OPS",
    20000,
    _parse_int,
    "Sync when this many ops are pending (bounds memory in loops that never sync).",
)

CACHE_DIR = Flag(
    "LAZYTPU_CACHE_DIR",
    None,
    lambda n, r: r,
    "Directory of the persistent compile cache (default ~/.cache/lazytpu; 'off' disables).",
)
PROGRAM_CACHE_SIZE = Flag(
    "LAZYTPU_PROGRAM_CACHE_SIZE",
    256,
    _parse_int,
    "Compiled programs kept in memory, least recently used evicted first (at least 1).",
)

DEBUG = Flag(
    "LAZYTPU_DEBUG",
    frozenset(),
    lambda n, r: frozenset(p.strip() for p in r.split(",") if p.strip()),
    "Comma list: 'recompile' logs why each recompile happened to stderr; 'bounds' checks index tensors.",
)
DUMP_DIR = Flag(
    "LAZYTPU_DUMP_DIR",
    None,
    lambda n, r: r,
    "Write each compiled program's IR and StableHLO text here, named by its key.",
)

FLAGS: tuple[Flag, ...] = (
    CPU_FALLBACK,
    PLATFORM,
    EAGER_MODE,
    DEFER_AND_FUSE,
    SYNC_ON_OPTIMIZER_STEP,
    MAX_PENDING_OPS,
    CACHE_DIR,
    PROGRAM_CACHE_SIZE,
    DEBUG,
    DUMP_DIR,
)


def load_all() -> None:
    """(Re)read every flag from the environment."""
    with _lock:
        for flag in FLAGS:
            flag.load()


load_all()
