"""The package's layout stays readable (docs/architecture.md, "The tree"):
few modules directly in lazytpu/, the recording stage in frontend/, and no
module too long to read in one sitting."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lazytpu"


def test_at_most_twelve_modules_directly_in_the_package():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top


def test_every_stage_is_a_folder():
    for stage in ("ir", "lowering", "fusion", "runtime", "frontend", "device", "compile", "distributed", "tools"):
        assert (PACKAGE / stage / "__init__.py").is_file(), stage


def test_no_module_over_600_lines():
    long = {
        str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 600
    }
    assert not long, long
