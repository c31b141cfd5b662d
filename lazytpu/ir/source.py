"""Where the user recorded an op: the innermost frame outside torch, jax and
lazytpu, kept on each node and shown as ``file:line``.

Note [Source locations]: each recorded node keeps ``(code, lasti)`` of the
innermost frame outside torch, jax and lazytpu: two attribute reads per
frame walked, and one dict hit per frame to tell internal code from user
code (keyed by ``id(code)``: hashing a code object hashes its bytecode and
constants). The line number and the text are computed only when shown
(``source_text``), on a failure or in a debug view. Deferred failures,
recompile explanations (``lazytpu.debug``) and program dumps name it.
"""

from __future__ import annotations

import os
import sys

from lazytpu import _caches

__all__ = ["location", "source_line", "source_text", "user_stacklevel"]

_INTERNAL = (os.sep + "torch" + os.sep, os.sep + "lazytpu" + os.sep, os.sep + "jax" + os.sep)

_CODE_IS_INTERNAL: dict[int, bool] = {}
_PINNED: list = []  # the codes classified above: alive, so that their ids are not reused


def _classify(code) -> bool:
    name = code.co_filename
    internal = any(part in name for part in _INTERNAL) or name.startswith("<frozen")
    _PINNED.append(code)
    _CODE_IS_INTERNAL[id(code)] = internal
    return internal


def _forget_codes() -> None:
    _CODE_IS_INTERNAL.clear()
    _PINNED.clear()


_caches.register("source_codes", _forget_codes)


def location(skip: int = 1):
    """``(code, lasti)`` of the innermost frame outside torch, jax and
    lazytpu, starting ``skip`` frames above this one (frames known to be
    internal need no walk); ``None`` when there is none (an op recorded by
    autograd's engine, which runs no Python code of the user's)."""
    try:
        frame = sys._getframe(skip)
    except ValueError:  # a shorter stack than the caller expected
        frame = sys._getframe(1)
    kinds = _CODE_IS_INTERNAL
    while frame is not None:
        code = frame.f_code
        internal = kinds.get(id(code))
        if internal is None:
            internal = _classify(code)
        if not internal:
            return (code, frame.f_lasti)
        frame = frame.f_back
    return None


def source_text(where) -> str | None:
    """``file:line`` of a node's ``source`` (Note [Source locations]): a
    ``(code, lasti)`` pair, a ready string, or None."""
    if where is None or type(where) is str:
        return where
    code, lasti = where
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return f"{code.co_filename}:{line}"
    return f"{code.co_filename}:{code.co_firstlineno}"


def source_line() -> str | None:
    """file:line of the innermost frame outside torch, jax and lazytpu."""
    return source_text(location())


def user_stacklevel() -> int:
    """The ``stacklevel`` at which a ``warnings.warn`` made by this function's
    caller names the innermost frame outside torch, jax and lazytpu (1, the
    caller, where there is none: autograd's engine thread)."""
    frame, level = sys._getframe(1), 1
    while frame is not None:
        internal = _CODE_IS_INTERNAL.get(id(frame.f_code))
        if not (_classify(frame.f_code) if internal is None else internal):
            return level
        frame, level = frame.f_back, level + 1
    return 1
