"""Every in-memory cache registers its ``clear`` here, so one call clears all;
memos keyed by call signatures are bounded (``memo``).

A cache is made registered in one line: ``_PLANS = _caches.memo("plans")`` (bounded,
Note [Memo bound]), ``_SEEN = _caches.table("seen")`` (a plain dict; ``table(name, set)``
a set, ``table(name, Cls)`` any object with ``clear``), or ``register(name, clear)`` for
what clears otherwise (an ``lru_cache``'s ``cache_clear``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")

_CLEARERS: dict[str, Callable[[], None]] = {}
_MEMOS: dict[str, Memo] = {}

# Entries one memo keeps (Note [Memo bound]).
MEMO_SIZE = 8192


def register(name: str, clear: Callable[[], None]) -> None:
    if name in _CLEARERS:
        raise ValueError(f"cache {name!r} registered twice")
    _CLEARERS[name] = clear


def table(name: str, kind: Callable[[], _T] = dict) -> _T:
    """A new ``kind()`` (a plain dict unless told), cleared with every cache.

    A dict or set made here is unbounded: for keys that stay few (ops, directories);
    one keyed by call signatures is a ``memo``."""
    value = kind()
    register(name, value.clear)
    return value


def clear_all() -> None:
    for clear in _CLEARERS.values():
        clear()


class Memo(dict):
    """A dict of derived facts keyed by call signatures, holding at most ``limit`` entries.

    Note [Memo bound]: recording memoizes per call signature (output metas,
    record and view plans, interned descriptors and op signatures, checks
    already made), and a signature holds shapes: a loop over thousands of
    distinct shapes made each memo grow by a few entries per shape (about
    25 KB of resident memory per shape) after the program cache had stopped
    growing (Note [Program cache bound] in runtime/executor). A memo that
    reaches its limit forgets its oldest quarter (insertion order), so memory
    stays flat; a forgotten entry is derived again when its signature comes
    back, which costs time and never changes a result. Reads are the plain
    dict's (``get``, ``in``, ``[]``); only inserting, which happens once per
    new signature, goes through Python.
    """

    __slots__ = ("limit", "forgotten")

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.forgotten = 0

    def _make_room(self, key) -> None:
        if len(self) >= self.limit and key not in self:
            oldest = list(itertools.islice(self, max(1, self.limit // 4)))
            for old in oldest:
                self.pop(old, None)
            self.forgotten += len(oldest)

    def __setitem__(self, key, value) -> None:
        self._make_room(key)
        dict.__setitem__(self, key, value)

    def setdefault(self, key, value):
        self._make_room(key)
        return dict.setdefault(self, key, value)

    def add(self, key) -> None:
        """Remember ``key`` (a memo used as a set)."""
        self[key] = True


def memo(name: str, limit: int = MEMO_SIZE) -> Memo:
    """A new bounded memo, cleared with every cache (Note [Memo bound])."""
    m = Memo(limit)
    register(name, m.clear)
    _MEMOS[name] = m
    return m


def clear_memos() -> None:
    """Forget what every memo derived (Note [Default dtype] in frontend/dispatch)."""
    for m in _MEMOS.values():
        m.clear()


def memos() -> dict[str, Memo]:
    """Every bounded memo, by name."""
    return dict(_MEMOS)
