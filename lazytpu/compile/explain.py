"""Why did a compiled graph compile again? (the ``torch.compile`` side of
``lazytpu.debug``'s recompile explanations).

A graph's *family* is where it came from: the dynamo frame and whether it is
the forward, backward or inference graph. When a family compiles a second
program (dynamo recompiled the frame after a guard failure, or a dynamic
graph met new sizes), the new input signature is compared with the last one
and the difference is explained: counted in ``metrics`` under
``recompile_reasons``, returned by ``explain()`` and, with
``LAZYTPU_DEBUG=recompile``, printed to stderr.
"""

from __future__ import annotations

import hashlib
import threading

from lazytpu import _caches, debug

__all__ = ["explain", "clear"]


class _History:
    """The last signature compiled per graph family, and the explanations."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: dict = {}
        self.explanations: list[str] = []
        self.count = 0

    def clear(self) -> None:
        with self.lock:
            self.last.clear()
            self.explanations.clear()
            self.count = 0


_HISTORY = _caches.table("compiled_graph_history", _History)


def _show(part) -> str:
    kind = part[0]
    if kind in ("buffer", "cpu", "view"):
        aval = part[1]
        text = f"{str(aval.dtype).replace('torch.', '')}{list(aval.shape)}"
        return text + (f" (window {list(part[3][0])})" if kind == "view" else "") + (" on cpu" if kind == "cpu" else "")
    if kind == "scalar":
        return "float"
    return repr(part[1])


def _reason(old, new, why: str) -> str:
    if old[0] in ("buffer", "cpu", "view") and new[0] in ("buffer", "cpu", "view"):
        if old[1].dtype != new[1].dtype:
            return f"{why} / new input dtypes"
        if old[1].shape != new[1].shape:
            return f"{why} / new input shapes"
        return f"{why} / new input layout"
    return f"{why} / new input values"


def _differences(old_program, old_parts, program, parts) -> list[tuple[str, str]]:
    # The same graph met new inputs (a dynamic graph, or a new view layout);
    # or dynamo recompiled the frame after a guard failed.
    why = "dynamic graph" if old_program is program else "guard failure"
    if len(old_parts) != len(parts):
        sizes = " (sizes became inputs: dynamic shapes)" if any(p[0] == "static" for p in parts) else ""
        return [(f"{why} / new graph", f"dynamo captured a new graph: {len(old_parts)} -> {len(parts)} inputs{sizes}")]
    out = []
    for name, a, b in zip(program.feed_names, old_parts, parts):
        if a != b:
            out.append((_reason(a, b, why), f"input {name}: {_show(a)} -> {_show(b)}"))
    if not out:
        out.append((f"{why} / new graph", "same inputs, different graph code (other constants or ops)"))
    return out


def _dump_graph(program, parts: tuple) -> None:
    """With ``LAZYTPU_DUMP_DIR`` set, write the graph's code as ``<hash>.fx.py``
    (named by code and signature; the programs holding it are dumped by the
    engine, Note [Graphs as nodes])."""
    if debug.dump_dir() is not None:
        name = hashlib.sha256((program.code + repr(parts)).encode()).hexdigest()[:16]
        debug.write_dump(name, {"fx.py": program.code})


def observe_compile(program, parts: tuple) -> bool:
    """Called once per new input signature of an FX graph (what makes a new
    program); whether it explained a recompile (the engine then does not
    explain the program holding the graph again: Note [Recompiles explained
    elsewhere] in ``lazytpu.debug``)."""
    _dump_graph(program, parts)
    with _HISTORY.lock:
        _HISTORY.count += 1
        number = _HISTORY.count
        previous = _HISTORY.last.get(program.family)
        _HISTORY.last[program.family] = (number, program, parts)
    if previous is None:
        return False
    n, old_program, old_parts = previous
    diffs = _differences(old_program, old_parts, program, parts)
    header = (
        f"lazytpu: compiling the {program.name} graph of {_family(program.family)} again "
        f"(compiled graph #{number}; last was #{n}):"
    )
    debug.report_recompile(header, diffs)
    with _HISTORY.lock:
        _HISTORY.explanations.append(debug.explain()[-1])
    return True


def _family(family) -> str:
    frame = family[0]
    return f"dynamo frame {frame}" if frame is not None else "a compiled function"


def explain() -> list[str]:
    """Explanations of every compiled-graph recompile so far (most recent last)."""
    with _HISTORY.lock:
        return list(_HISTORY.explanations)


def clear() -> None:
    """Forget compiled-graph history and explanations."""
    _HISTORY.clear()
