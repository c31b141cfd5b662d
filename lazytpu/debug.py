"""Why did it recompile? Pending-graph inspection, program dumps.

    LAZYTPU_DEBUG=recompile python train.py     # explanations on stderr
    lazytpu.debug.explain()                     # the same, as a list of str
    lazytpu.debug.pending_graph(loss)           # IR text (or format="dot")
    LAZYTPU_DUMP_DIR=/tmp/dump python train.py  # IR + StableHLO per compile

Every recorded op carries the user's source location (file:line of the code
that recorded it, Note [Source locations] in ``lazytpu.ir.source``): deferred
failures, recompile explanations and program dumps name it.

The engine does not import this module: importing it registers its observer
of compiles with the engine (Note [Engine observers] in ``lazytpu.engine``).
"""

from __future__ import annotations

import collections
import difflib
import hashlib
import os
import sys
import threading
import warnings
from pathlib import Path

from lazytpu import _caches, _config, engine, metrics

__all__ = ["explain", "pending_graph", "format_program", "clear"]

# -- formatting ---------------------------------------------------------------


def _ref(r) -> str:
    return f"%in{r[1]}" if r[0] == "in" else f"%{r[0]}" + (f".{r[1]}" if r[1] else "")


def _aval(a) -> str:
    return f"{str(a.dtype).replace('torch.', '')}{list(a.shape)}"


def _kind(k) -> str:
    if hasattr(k, "value"):  # a number compiled in (Note [Scalar specialization] in lazytpu.fusion.specialize)
        return f"{k.kind.__name__} constant {k.value!r}"
    return _aval(k) if hasattr(k, "shape") else f"{k.__name__} scalar"


def _static(spec) -> str:
    from lazytpu.ir.template import Slot

    def show(v):
        if isinstance(v, Slot):
            return "_"
        if isinstance(v, tuple):
            return "[" + ", ".join(show(x) for x in v) + "]"
        return repr(v)

    parts = [show(a) for a in spec.args] + [f"{k}={show(v)}" for k, v in spec.kwargs]
    return ", ".join(parts)


def format_program(program) -> str:
    """Readable text of a fused program: one line per op."""
    lines = [f"program: {len(program.ops)} ops, {len(program.input_kinds)} inputs"]
    lines += [f"  %in{i}: {_kind(k)}" for i, k in enumerate(program.input_kinds)]
    for j, op in enumerate(program.ops):
        args = ", ".join(_ref(r) for r in op.inputs)
        outs = ", ".join(_aval(a) for a in op.out_avals)
        where = f"  # {op.source}" if op.source else ""
        lines.append(f"  %{j} = {op.op}({args}) [{_static(op.spec)}] -> {outs}{where}")
    lines.append("  return " + ", ".join(_ref(r) for r in program.outputs))
    return "\n".join(lines)


def _dot(program) -> str:
    lines = ["digraph lazytpu {", "  rankdir=TB;", '  node [shape=box, fontname="monospace"];']
    for i, k in enumerate(program.input_kinds):
        lines.append(f'  in{i} [label="in{i}\\n{_kind(k)}", shape=ellipse];')
    for j, op in enumerate(program.ops):
        label = f"%{j} {op.op}\\n" + ", ".join(_aval(a) for a in op.out_avals)
        if op.source:
            label += "\\n" + os.path.basename(op.source)
        lines.append(f'  n{j} [label="{label}"];')
        for r in op.inputs:
            src = f"in{r[1]}" if r[0] == "in" else f"n{r[0]}"
            lines.append(f"  {src} -> n{j};")
    for r in program.outputs:
        lines.append(f"  n{r[0]} [penwidth=2];")
    lines.append("}")
    return "\n".join(lines)


def pending_graph(*tensors, format: str = "text") -> str:
    """The pending IR that a sync would run now, as text or Graphviz DOT.

    Args:
        *tensors: restrict to what these tensors need (default: every live
            pending tensor on device 0).
        format: ``"text"`` or ``"dot"``.
    """
    from lazytpu.frontend.windows import read
    from lazytpu.fusion import build_program
    from lazytpu.ir import Output

    if tensors:
        roots = [v for v in (read(t) for t in tensors) if isinstance(v, Output)]
    else:
        roots = engine.context(0).graph.roots()
    if not roots:
        return "(nothing pending)" if format == "text" else "digraph lazytpu {}"
    program, _, _ = build_program(roots)
    if format == "dot":
        return _dot(program)
    if format != "text":
        raise ValueError(f"format must be 'text' or 'dot', not {format!r}")
    return format_program(program)


# -- recompile explanations -----------------------------------------------------


class _History:
    """Programs compiled so far (bounded) and the explanations of recompiles."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.programs: collections.deque = collections.deque(maxlen=256)
        self.explanations: list[str] = []
        self.count = 0

    def clear(self) -> None:
        with self.lock:
            self.programs.clear()
            self.explanations.clear()
            self.count = 0


_HISTORY = _caches.table("recompile_history", _History)
_SHOWN = 4


def _op_names(program) -> tuple:
    return tuple(str(op.op) for op in program.ops)


def _first_use(program, slot: int) -> str:
    for j, op in enumerate(program.ops):
        if ("in", slot) in op.inputs:
            where = f" at {op.source}" if op.source else ""
            return f"first used by %{j} {op.op}{where}"
    return "unused"


# Note [Recompiles explained elsewhere]: an op whose static argument says it
# was already explained where it was made (a compiled graph's new input
# signature: ``lazytpu.compile.explain``) is not explained, nor counted, again
# for the program holding it: neither its static argument nor the inputs it
# uses first.
def _explained_elsewhere(op) -> bool:
    return any(getattr(v, "recompile_explained", False) for _, v in getattr(op.spec, "kwargs", ()))


def _first_user(program, slot: int):
    return next((op for op in program.ops if ("in", slot) in op.inputs), None)


def _differences(old, new) -> list[tuple[str, str]]:
    """(reason, detail) pairs explaining how ``new`` differs from ``old``."""
    out = []
    if _op_names(old) == _op_names(new):
        elsewhere = {id(b) for a, b in zip(old.ops, new.ops) if a.spec != b.spec and _explained_elsewhere(b)}
        if len(old.input_kinds) != len(new.input_kinds):
            out.append(
                (
                    "inputs differ",
                    f"{len(old.input_kinds)} -> {len(new.input_kinds)} inputs "
                    "(which tensors are the same buffer changed)",
                )
            )
        for i, (a, b) in enumerate(zip(old.input_kinds, new.input_kinds)):
            if a != b and not (elsewhere and id(_first_user(new, i)) in elsewhere):
                what = "shape" if getattr(a, "dtype", None) == getattr(b, "dtype", None) else "dtype"
                number = hasattr(a, "value") or hasattr(b, "value")  # Note [Scalar specialization]
                reason = "Python number changed" if number else f"input {what} changed"
                out.append((reason, f"input %in{i} ({_first_use(new, i)}): {_kind(a)} -> {_kind(b)}"))
        for j, (a, b) in enumerate(zip(old.ops, new.ops)):
            if id(b) in elsewhere:
                continue
            if a.spec != b.spec:
                where = f" at {b.source}" if b.source else ""
                out.append(
                    ("static argument changed", f"%{j} {b.op}{where}: [{_static(a.spec)}] -> [{_static(b.spec)}]")
                )
            elif a.inputs != b.inputs:
                out.append(
                    (
                        "operands changed",
                        f"%{j} {b.op}: ({', '.join(map(_ref, a.inputs))}) -> ({', '.join(map(_ref, b.inputs))})",
                    )
                )
        if not out and not elsewhere and old.outputs != new.outputs:
            out.append(("outputs changed", "a different set of live tensors was materialized"))
        return out
    matcher = difflib.SequenceMatcher(a=_op_names(old), b=_op_names(new), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        where = next((f" at {op.source}" for op in new.ops[j1:j2] if op.source), "")
        olds = ", ".join(str(op.op) for op in old.ops[i1:i2]) or "nothing"
        news = ", ".join(str(op.op) for op in new.ops[j1:j2]) or "nothing"
        out.append(("ops differ", f"ops %{j1}..%{max(j1, j2 - 1)}: {olds} -> {news}{where}"))
        if len(out) >= 5:
            break
    return out


def observe_compile(program, lowered) -> None:
    """Called by the engine for each program it compiles (a cache miss):
    registered below as its "compile" observer (Note [Engine observers])."""
    dump_program(lowered, {"ir.txt": format_program(program) + "\n"})
    with _HISTORY.lock:
        _HISTORY.count += 1
        number = _HISTORY.count
        best, best_score = None, 0.0
        sig = _op_names(program)
        for n, old in reversed(_HISTORY.programs):
            score = difflib.SequenceMatcher(a=_op_names(old), b=sig, autojunk=False).quick_ratio()
            if score > best_score:
                best, best_score = (n, old), score
            if score == 1.0:
                break
        _HISTORY.programs.append((number, program))
    if best is None or best_score < 0.5:
        return
    n, old = best
    diffs = _differences(old, program)
    if not diffs:
        return
    header = (
        f"lazytpu: compiling program #{number} ({len(program.ops)} ops); closest earlier program is #{n} "
        f"({len(old.ops)} ops):"
    )
    report_recompile(header, diffs)


engine.observe("compile", observe_compile)


def report_recompile(header: str, diffs: list[tuple[str, str]]) -> None:
    """Count, keep and (with ``LAZYTPU_DEBUG=recompile``) print one recompile
    explanation: ``diffs`` are (reason, detail) pairs, most important first.
    Shared by eager programs and ``torch.compile`` graphs."""
    for reason in dict.fromkeys(reason for reason, _ in diffs):
        metrics.count("recompile_reasons", reason)
    shown = [f"  - {reason}: {detail}" for reason, detail in diffs[:_SHOWN]]
    if len(diffs) > _SHOWN:
        shown.append(f"  ... and {len(diffs) - _SHOWN} more differences (mostly consequences of the first)")
    text = header + "\n" + "\n".join(shown)
    with _HISTORY.lock:
        _HISTORY.explanations.append(text)
    if "recompile" in _config.DEBUG.value:
        print(text, file=sys.stderr)


def explain() -> list[str]:
    """Explanations of every recompile so far (most recent last)."""
    with _HISTORY.lock:
        return list(_HISTORY.explanations)


def clear() -> None:
    """Forget compiled-program history and explanations."""
    _HISTORY.clear()


# Note [Dump directory]: a ``LAZYTPU_DUMP_DIR`` that cannot be written (a
# file, a path under a file, no permission) gives one warning and dumps stop;
# the programs themselves still compile and run.
class _DumpDirs:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.broken: set[str] = set()

    def clear(self) -> None:
        with self.lock:
            self.broken.clear()


_DUMP_DIRS = _caches.table("broken_dump_dirs", _DumpDirs)


def dump_dir() -> Path | None:
    """``LAZYTPU_DUMP_DIR``, or None when unset or found unwritable."""
    raw = _config.DUMP_DIR.get()
    if not raw or raw in _DUMP_DIRS.broken:
        return None
    return Path(raw)


def write_dump(name: str, files: dict[str, str]) -> None:
    """Write ``files`` (suffix -> text) to ``LAZYTPU_DUMP_DIR`` as
    ``<name>.<suffix>`` (Note [Dump directory])."""
    root = dump_dir()
    if root is None:
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        for suffix, content in files.items():
            (root / f"{name}.{suffix}").write_text(content)
    except OSError as exc:
        raw = _config.DUMP_DIR.get()
        with _DUMP_DIRS.lock:
            first = raw not in _DUMP_DIRS.broken
            _DUMP_DIRS.broken.add(raw)
        if first:
            warnings.warn(
                f"lazytpu: cannot write program dumps to LAZYTPU_DUMP_DIR={root} ({exc}); "
                "programs run, but are not dumped",
                stacklevel=2,
            )


def dump_program(lowered, files: dict[str, str]) -> None:
    """With ``LAZYTPU_DUMP_DIR`` set, write a compiled program's StableHLO and
    ``files`` (suffix -> text) there, named by the hash of the StableHLO."""
    if dump_dir() is None:
        return
    text = lowered.as_text()
    name = hashlib.sha256(text.encode()).hexdigest()[:16]
    write_dump(name, {**files, "stablehlo.mlir": text})
