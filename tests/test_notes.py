"""Every Note cited in the code and the docs is defined, once, where the citation says.

A Note records a design decision (docs/architecture.md, "Notes"): one
paragraph, in a docstring or a ``#`` comment, defines it by starting a line
with its title and a colon (``Note [Lanes]:``); other places cite it by title
(``Note [Lanes]``), optionally saying where it is defined (``Note [Lanes] in
lazytpu/engine.py``, ``in lazytpu.engine`` or ``in engine``). A citation of a
Note that does not exist, or of the wrong file, sends the reader nowhere, and
a Note defined twice drifts apart. This reads the source text only: it
imports nothing of lazytpu.
"""

from __future__ import annotations

import bisect
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("lazytpu", "tests", "benchmarks", "examples")
FILES = [
    *(path for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))),
    *sorted((ROOT / "docs").rglob("*.md")),
    ROOT / "README.md",
    ROOT / "benchmarks" / "README.md",
]
# Matched in a file's text with each line's indentation and leading ``#`` removed, so that a title or a location
# may wrap onto the next line of a comment. Groups: the title, a definition's colon, a citation's location.
NOTE = re.compile(r"Note\s+\[([^\[\]]+)\](:?)(?:\s+in\s+\[?`{0,2}([\w./]+))?")
DOCSTRING_OPENING = re.compile(r'[rRbBuU]?("""|\'\'\')')


def _module(path: Path) -> str:
    """``lazytpu/frontend/dispatch.py`` -> ``lazytpu/frontend/dispatch``; a package is its folder."""
    return path.relative_to(ROOT).as_posix().removesuffix(".py").removesuffix("/__init__")


MODULES = [_module(path) for path in FILES]


@functools.cache
def _scan() -> tuple[dict[str, list[str]], list[tuple[str, str, str | None]]]:
    """(title -> ``file:line`` of each definition, [(``file:line``, title, location or None) of each citation])."""
    definitions: dict[str, list[str]] = {}
    citations = []
    for path in FILES:
        lines = [line.strip().lstrip("#").strip() for line in path.read_text().splitlines()]
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line) + 1)
        text = "\n".join(lines)
        for m in NOTE.finditer(text):
            row = bisect.bisect_right(starts, m.start()) - 1
            where = f"{path.relative_to(ROOT)}:{row + 1}"
            title = " ".join(m[1].split())
            before = text[starts[row] : m.start()]
            if m[2] and (not before or DOCSTRING_OPENING.fullmatch(before)):
                definitions.setdefault(title, []).append(where)
            else:
                citations.append((where, title, m[3] and m[3].rstrip(".")))
    return definitions, citations


def _named(location: str) -> list[str]:
    """The modules a location names: a path (``.py`` or not), a dotted module, or the tail of either."""
    if "/" not in location and not location.endswith((".py", ".md")):
        location = location.replace(".", "/")
    location = location.removesuffix(".py")
    return [m for m in MODULES if m == location or m.endswith("/" + location)]


def test_every_cited_note_is_defined():
    definitions, citations = _scan()
    missing = [f"{at}: {title!r} is cited, never defined" for at, title, _ in citations if title not in definitions]
    assert not missing, "\n".join(missing)


def test_no_note_is_defined_twice():
    definitions, _ = _scan()
    twice = [f"{title!r} is defined at {', '.join(at)}" for title, at in definitions.items() if len(at) > 1]
    assert not twice, "\n".join(twice)


def test_every_cited_location_is_the_defining_file():
    definitions, citations = _scan()
    wrong = []
    for at, title, location in citations:
        if location is None or title not in definitions:
            continue
        named = _named(location)
        defined_at = definitions[title][0]
        if named != [_module(ROOT / defined_at.rpartition(":")[0])]:
            wrong.append(f"{at}: {title!r} in {location} names {', '.join(named) or 'nothing'}, not {defined_at}")
    assert not wrong, "\n".join(wrong)
