"""Every in-memory cache registers its ``clear`` here, so one call clears all."""

from __future__ import annotations

from collections.abc import Callable

_CLEARERS: dict[str, Callable[[], None]] = {}


def register(name: str, clear: Callable[[], None]) -> None:
    if name in _CLEARERS:
        raise ValueError(f"cache {name!r} registered twice")
    _CLEARERS[name] = clear


def clear_all() -> None:
    for clear in _CLEARERS.values():
        clear()
