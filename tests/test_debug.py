"""Recompile explanations, pending-graph inspection, dumps."""

from __future__ import annotations

import os
import subprocess
import sys

import torch

import lazytpu
from lazytpu import _config


def _step(model, batch: int):
    x = torch.randn(batch, 6).to("tpu")
    return model(x).square().mean().item()  # the line that recorded the input


def test_explains_a_shape_change_with_the_source_line():
    lazytpu.debug.clear()
    model = torch.nn.Linear(6, 3).to("tpu")
    with _config.DEBUG.override(frozenset({"recompile"})):
        _step(model, 9)
        _step(model, 9)
        lazytpu.metrics.reset()
        _step(model, 7)
    explanation = lazytpu.debug.explain()[-1]
    assert "input shape changed" in explanation
    assert "float32[9, 6] -> float32[7, 6]" in explanation
    assert f"{__file__}:" in explanation  # the user's file:line that used the input
    assert "input shape changed" in lazytpu.metrics.report()
    assert lazytpu.metrics.snapshot()["recompile_reasons"]["input shape changed"] == 1


def test_explains_a_different_op_and_a_static_argument():
    lazytpu.debug.clear()
    x = torch.randn(4, 5).to("tpu")
    lazytpu.sync()
    (x.sum(0) * 2).cpu()
    (x.sum(1) * 2).cpu()
    (x.sum(1) + 2).cpu()
    first, second = lazytpu.debug.explain()[-2:]
    assert "static argument changed" in first and "[_, [0]] -> [_, [1]]" in first
    assert "ops differ" in second and "aten.mul.Tensor -> aten.add.Tensor" in second


def test_recompile_log_on_stderr():
    code = "import torch, lazytpu\nfor n in (3, 3, 5):\n    (torch.ones(n).to('tpu') * 2).cpu()\n"
    env = dict(os.environ, LAZYTPU_DEBUG="recompile")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "input shape changed" in out.stderr and "float32[3] -> float32[5]" in out.stderr


def test_every_op_records_the_users_line():
    from lazytpu.ir.source import source_text

    model = torch.nn.Linear(2, 2).to("tpu")
    with _config.DEBUG.override(frozenset()):  # no debug mode needed
        line = sys._getframe().f_lineno + 1
        x = torch.ones(2).to("tpu") + 1
        y = model(x)  # recorded inside torch.nn: the line is still the user's
    assert source_text(x._lt_storage.value.node.source) == f"{__file__}:{line}"
    assert source_text(y._lt_storage.value.node.source) == f"{__file__}:{line + 1}"


def test_pending_graph_text_and_dot():
    with _config.DEBUG.override(frozenset({"sources"})):
        a = torch.ones(2, 3).to("tpu")
        b = (a * 2).sum(0)
    text = lazytpu.debug.pending_graph(b)
    assert "aten.mul.Tensor" in text and "aten.sum.dim_IntList" in text and "float32[3]" in text
    assert f"{os.path.basename(__file__)}" in text
    dot = lazytpu.debug.pending_graph(b, format="dot")
    assert dot.startswith("digraph") and "->" in dot
    lazytpu.sync()
    assert lazytpu.debug.pending_graph(b) == "(nothing pending)"


def test_dump_dir_writes_ir_and_stablehlo(tmp_path):
    with _config.DUMP_DIR.override(str(tmp_path)):
        (torch.arange(7.0).to("tpu") * 3 - 1).cpu()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert any(n.endswith(".ir.txt") for n in names) and any(n.endswith(".stablehlo.mlir") for n in names)
    hlo = next(p for p in tmp_path.iterdir() if p.name.endswith(".mlir")).read_text()
    assert "stablehlo" in hlo
