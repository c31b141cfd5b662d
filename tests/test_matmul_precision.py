"""``torch.set_float32_matmul_precision`` on tpu (Note [Matmul precision]).

XLA:CPU computes float32 products in full precision whatever the setting,
so what is checked here is what the compiled program asks the platform for
(the StableHLO of each program, written to ``LAZYTPU_DUMP_DIR``) and which
programs are compiled; the numbers equal CPU torch's under every setting.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import lazytpu
from lazytpu import _config

# What XLA is asked for, in the StableHLO of a product, by torch's setting.
ASKED = {"highest": "HIGHEST", "high": "HIGH", "medium": "DEFAULT"}


@pytest.fixture
def dump_dir(tmp_path):
    lazytpu.runtime.clear_caches()  # a program is dumped when compiled: none may come from the cache
    with _config.DUMP_DIR.override(str(tmp_path)):  # LAZYTPU_DUMP_DIR, read at import
        yield tmp_path


@pytest.fixture
def precision():
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


def _asked(dump_dir) -> set[str]:
    """The precisions the dumped programs ask for, and forget the dumps."""
    found = set()
    for path in dump_dir.glob("*.stablehlo.mlir"):
        found.update(re.findall(r"precision = \[(\w+), \w+\]", path.read_text()))
        path.unlink()
    return found


def _compiled() -> int:
    return lazytpu.metrics.snapshot()["programs_compiled"]


def test_the_default_is_full_float32_as_on_cpu(dump_dir):
    assert torch.get_float32_matmul_precision() == "highest"
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    got = (a.to("tpu") @ b.to("tpu")).cpu()
    torch.testing.assert_close(got, a @ b)
    assert _asked(dump_dir) == {"HIGHEST"}


@pytest.mark.parametrize("setting", ["highest", "high", "medium"])
def test_each_setting_is_what_the_program_asks_for(setting, dump_dir, precision):
    x, w = torch.randn(4, 8, dtype=torch.float32), torch.randn(8, 8)
    precision(setting)
    lin = F.linear(x.to("tpu"), w.to("tpu")).cpu()
    bmm = torch.bmm(x[None].to("tpu"), w[None].to("tpu")).cpu()
    assert _asked(dump_dir) == {ASKED[setting]}
    torch.testing.assert_close(lin, F.linear(x, w))  # XLA:CPU: float32 in every case
    torch.testing.assert_close(bmm, torch.bmm(x[None], w[None]))


def test_changing_the_setting_compiles_again_and_changing_back_reuses(dump_dir, precision):
    a = torch.randn(6, 6).to("tpu")
    lazytpu.sync()
    counts = []
    for setting in ("highest", "medium", "highest", "medium"):
        precision(setting)
        before = _compiled()
        (a @ a).cpu()
        counts.append(_compiled() - before)
    assert counts == [counts[0], 1, 0, 0]


def test_the_setting_at_the_flush_applies_to_the_program(dump_dir, precision):
    """Ops recorded under one setting and computed after a change run with the setting at the flush."""
    a = torch.randn(5, 5).to("tpu")
    precision("highest")
    product = a @ a
    precision("medium")
    product.cpu()
    assert _asked(dump_dir) == {"DEFAULT"}
