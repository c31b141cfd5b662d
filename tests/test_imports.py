"""Imports run one way (docs/architecture.md, "Who may import whom").

The allowed order is the ``imports`` block of docs/architecture.md, read
here: a module may import its own line and the lines before it. Every import
counts, at the top of a module or inside a function, since a function-local
import that runs back up is the same dependency, only hidden. Read from the
source text: nothing of lazytpu is imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "lazytpu"


def _order() -> list[list[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    (block,) = re.findall(r"```imports\n(.*?)```", text, flags=re.S)
    return [line.split() for line in block.strip().splitlines()]


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> list[tuple[str, int]]:
    """The lazytpu modules ``path`` imports, each with a line that does."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("lazytpu"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.append((full if full in MODULES else _owner(node.module), node.lineno))
        elif isinstance(node, ast.Import):
            out += [(_owner(a.name), node.lineno) for a in node.names if a.name.startswith("lazytpu")]
    return out


def _owner(name: str) -> str:
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _line(module: str, order) -> int | None:
    """The line of the order a module belongs to: its longest listed prefix."""
    best = None
    for i, names in enumerate(order):
        for name in names:
            if module == name or module.startswith(name + "."):
                if best is None or len(name) > best[1]:
                    best = (i, len(name))
    return None if best is None else best[0]


def test_every_module_has_a_place_in_the_order():
    order = _order()
    listed = [name for names in order for name in names]
    assert len(listed) == len(set(listed)), "a name is listed twice"
    assert [m for m in sorted(MODULES) if _line(m, order) is None] == []
    assert [n for n in listed if n not in MODULES] == [], "the order names a module that does not exist"


def test_no_import_runs_back_up():
    order = _order()
    upward = []
    for module, path in sorted(MODULES.items()):
        mine = _line(module, order)
        for target, lineno in _imports(path):
            if target != module and _line(target, order) > mine:
                upward.append(f"{path.relative_to(ROOT)}:{lineno}: {module} imports {target}, which comes after it")
    assert not upward, "\n".join(upward)


def test_no_import_cycle():
    graph = {m: {t for t, _ in _imports(p) if t != m} for m, p in MODULES.items()}
    done: set = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return path[path.index(module) :] + [module]
        if module in done:
            return None
        for target in sorted(graph[module]):
            cycle = visit(target, path + [module])
            if cycle:
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        cycle = visit(module, [])
        assert cycle is None, " -> ".join(cycle)


def _private_uses(path: Path) -> list[str]:
    """``from lazytpu.x import _name``, and ``module._name`` of a lazytpu module bound by an import."""
    tree = ast.parse(path.read_text())
    bound = {}  # local name -> lazytpu module
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("lazytpu"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                if full in MODULES:
                    bound[alias.asname or alias.name] = full
                elif alias.name.startswith("_"):
                    uses.append(f"{node.lineno}: {full}")
        elif isinstance(node, ast.Import):
            bound.update({a.asname: a.name for a in node.names if a.asname and a.name.startswith("lazytpu")})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                uses.append(f"{node.lineno}: {bound[node.value.id]}.{node.attr}")
    return uses


def test_no_private_name_is_used_across_lazytpu_modules():
    """Shared names are public: a ``_name`` of another module is an internal
    detail leaking (modules named with a leading underscore, such as
    ``_config``, are the package's own and may be imported)."""
    leaks = [f"{path.relative_to(ROOT)}:{use}" for _, path in sorted(MODULES.items()) for use in _private_uses(path)]
    assert not leaks, "\n".join(leaks)
