"""PyTorch's OpInfo ``op_db`` on ``tpu`` against CPU torch (``lazytpu.tools.opinfo``).

By default a fixed slice runs (every ``SLICE_EVERY``-th entry, float32
forward, defer mode); ``LAZYTPU_OPINFO=full`` (``make test-opinfo``) runs every
entry in every supported dtype of float32/float64/int64/int32/bool/bfloat16/
float16/complex64, float32 and complex64 gradients, and a fixed sample in strict mode
(Note [OpInfo slices]). A case fails on a mismatch (values, dtype or shape),
an error, or any CPU fallback.

Expected failures are data: ``opinfo_xfails.json`` maps a case id to its
reason, applied as ``xfail(strict=True)``: a case that starts passing fails
until its line is removed (``python -m lazytpu.tools.coverage --xfails`` rewrites
the file from a run, with the reasons of that run).
"""

from __future__ import annotations

import json
import os
import pathlib
import warnings

import pytest

from lazytpu.tools import opinfo

XFAILS_PATH = pathlib.Path(__file__).with_name("opinfo_xfails.json")
XFAILS: dict[str, str] = json.loads(XFAILS_PATH.read_text())
FULL = os.environ.get("LAZYTPU_OPINFO", "") == "full"
CASES = opinfo.cases(full=FULL)


def _param(case: opinfo.Case):
    reason = XFAILS.get(case.id)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(case, id=case.id, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_opinfo(case: opinfo.Case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fallback warnings: counted and reported instead
        failure = case.run()
    assert failure is None, str(failure)


def test_xfails_name_real_cases():
    """Every expected failure names a case of the full run, with a reason."""
    known = {c.id for c in opinfo.cases(full=True)}
    stale = sorted(set(XFAILS) - known)
    assert not stale, f"opinfo_xfails.json names cases that do not exist: {stale[:10]}"
    assert all(isinstance(r, str) and r.strip() for r in XFAILS.values())


def test_slice_is_representative():
    """The default slice spans op_db (Note [OpInfo slices])."""
    slice_ = opinfo.cases(full=False)
    entries = {c.entry for c in slice_}
    assert len(entries) >= len(opinfo.entries()) // (opinfo.SLICE_EVERY + 1)
    assert all(c.kind == "forward" and c.mode == "defer" for c in slice_)


def test_runner_detects_a_wrong_result(monkeypatch):
    """A case fails when ``tpu`` computes something else (the test can fail)."""
    import torch

    op = opinfo.entry("abs")
    monkeypatch.setattr(op, "op", lambda x, *a, **k: torch.abs(x) + (1 if x.device.type == "tpu" else 0))
    failure = opinfo.run_case(op, torch.float32, max_samples=2)
    assert failure is not None and failure.kind == "mismatch"


def test_coverage_report(tmp_path, capsys):
    """``python -m lazytpu.tools.coverage`` writes Markdown and JSON with totals."""
    from lazytpu.tools import coverage

    assert coverage.main(["--limit", "3", "--out", str(tmp_path), "--quiet"]) == 0
    report = json.loads((tmp_path / "coverage.json").read_text())
    assert {rec["status"] for rec in report["ops"].values()} <= set(coverage.STATUSES)
    assert set(report["totals"]) == {*coverage.STATUSES, "on_device"}
    assert report["pass_rates"]["forward float32"]["total"] >= 1
    assert "| status | ops | overloads |" in (tmp_path / "coverage.md").read_text()
    assert "Pass rates" in capsys.readouterr().out


def test_coverage_routes():
    import torch

    from lazytpu.tools import coverage

    aten = torch.ops.aten
    assert coverage.route(aten.sort.default) == "lowered"  # a rule
    assert coverage.route(aten.sort.values) == "lowered"  # out= of a lowered op
    assert coverage.route(aten.transpose.int) == "lowered"  # a view
    assert coverage.route(aten.nuclear_norm.default) == "decomposed"  # CompositeImplicit
