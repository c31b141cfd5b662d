"""Ops with no lowering: CPU fallback, counted and warned once; or an error."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

import lazytpu
from lazytpu import _config

# An op no lowering rule, decomposition or composite covers: one with only a CPU kernel.
# (An ATen op would do until someone lowers it.)
_DEFINE = """
_LIB = torch.library.Library("lazytpu_fallback_test", "DEF")
_LIB.define("twice_plus_one(Tensor x) -> Tensor")
_LIB.impl("twice_plus_one", lambda x: x * 2 + 1, "CPU")
"""
exec(_DEFINE)
OP_NAME = "lazytpu_fallback_test.twice_plus_one.default"


def _fallback_op(x):
    return torch.ops.lazytpu_fallback_test.twice_plus_one(x)


def test_fallback_matches_cpu_counted_and_warned_once():
    x = torch.randn(4, 3)
    lazytpu.metrics.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a = _fallback_op(x.to("tpu"))
        b = _fallback_op(x.to("tpu") + 0)
    assert a.device.type == "tpu"
    torch.testing.assert_close(a.cpu(), _fallback_op(x))
    torch.testing.assert_close(b.cpu(), _fallback_op(x))
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {OP_NAME: 2}
    relevant = [w for w in caught if "twice_plus_one" in str(w.message)]
    assert len(relevant) <= 1  # once per op per process
    assert all(w.filename == __file__ for w in relevant)  # the user's line


def test_fallback_result_keeps_recording():
    x = torch.randn(4, 3).to("tpu")
    y = _fallback_op(x) * 2 + 1
    assert y._lt_storage.pending
    torch.testing.assert_close(y.cpu(), _fallback_op(x.cpu()) * 2 + 1)


def test_fallback_off_raises_not_implemented_naming_the_op():
    with _config.CPU_FALLBACK.override(False):
        try:
            _fallback_op(torch.randn(2, 2).to("tpu"))
        except NotImplementedError as exc:
            assert "twice_plus_one" in str(exc)
        else:
            raise AssertionError("expected NotImplementedError")


def test_fallback_env_var():
    env = dict(os.environ, LAZYTPU_CPU_FALLBACK="0")
    code = (
        "import torch, lazytpu\n" + _DEFINE + "try:\n"
        "    torch.ops.lazytpu_fallback_test.twice_plus_one(torch.ones(2, 2, device='tpu'))\n"
        "except NotImplementedError as e:\n"
        "    print('NIE', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("NIE") and "twice_plus_one" in out.stdout


def test_results_made_on_the_host_keep_cpus_layout():
    """``nonzero``/``argwhere`` (Note [Data-dependent shapes]) are column-major on CPU;
    their tpu results were contiguous, so ``.view(-1)`` worked where CPU's raises."""
    mask = torch.tensor([[True, False, True], [False, True, True]])
    for op in (torch.nonzero, torch.argwhere):
        got, expected = op(mask.to("tpu")), op(mask)
        assert got.stride() == expected.stride() == (1, 4)
        assert got.cpu().tolist() == expected.tolist()
        assert torch.as_strided(got, (8,), (1,)).cpu().tolist() == torch.as_strided(expected, (8,), (1,)).tolist()
        try:
            expected.view(-1)
        except RuntimeError as e:
            with pytest.raises(RuntimeError, match=re.escape(str(e))):
                got.view(-1)
