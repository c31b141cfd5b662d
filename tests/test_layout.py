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


def test_one_cpu_probe_for_every_check():
    """A check that runs a call on CPU stand-ins goes through
    ``checks/probe.py`` (Note [CPU probes]); no other recording module runs
    ops under ``no_grad`` of its own or restores the CPU generator around them."""
    own = {"frontend/checks/probe.py", "frontend/windows.py", "frontend/tensor.py"}  # the last two: not probes
    probing = {
        str(p.relative_to(PACKAGE))
        for p in (PACKAGE / "frontend").rglob("*.py")
        if any(s in p.read_text() for s in ("torch.no_grad()", "fork_rng", "set_rng_state"))
    }
    assert probing <= own, probing - own
    users = {
        p.name
        for p in (PACKAGE / "frontend").rglob("*.py")
        if "from lazytpu.frontend.checks.probe import" in p.read_text()
    }
    assert {
        "metas.py",
        "scalars.py",
        "kernel_checks.py",
        "overlap.py",
        "bounds.py",
        "value_checks.py",
    } <= users
    assert "inplace.py" in users
