"""Ops given floating operands of different dtypes give CPU torch's result
dtype and values, where torch's meta kernel or decomposition promotes
otherwise (found by ``make mixed-sweep``, tests/mixed_sweep.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import no_fallback, run_both

F32, F64, BF16 = torch.float32, torch.float64, torch.bfloat16


def _t(*shape, dtype=F32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


CASES = {
    # the base's dtype (a copy into the slice); torch's decomposition promoted through ``where``
    # or, for a window covering the whole dim, returned ``src``'s dtype
    "slice_scatter_f64_src": (
        lambda: (_t(4, 6), _t(4, 2, dtype=F64)),
        lambda x, s: torch.slice_scatter(x, s, 1, 1, 5, 2),
    ),
    "slice_scatter_f32_src_whole": (lambda: (_t(4, 6, dtype=F64), _t(4, 6)), lambda x, s: torch.slice_scatter(x, s, 1)),
    # the input's dtype (CPU's ``empty_like(input)``); the meta kernels promoted to the target's
    "huber_loss": (lambda: (_t(5), _t(5, dtype=F64, seed=1)), lambda x, t: F.huber_loss(x, t, delta=0.5)),
    "soft_margin_loss": (lambda: (_t(5), _t(5, dtype=F64, seed=1).sign()), F.soft_margin_loss),
    # CPU expands ``self`` before promoting: a 0-dim float32 one wins over bfloat16 vectors,
    # and the outer product is computed in float32
    "addr_0dim_self": (lambda: (_t(), _t(5, dtype=BF16), _t(4, dtype=BF16, seed=1)), torch.addr),
    "addr_bf16_vectors": (
        lambda: (_t(5, 4), _t(5, dtype=BF16) * 8, _t(4, dtype=BF16, seed=1) * 8),
        lambda m, v, w: torch.addr(m, v, w, beta=0.5),
    ),
    # CPU's ``self * pow(2.0, other)`` rounds the power to bfloat16; torch's decomposition raised a float32 2
    "ldexp_bf16_exponent": (lambda: (_t(5), torch.tensor(2.7, dtype=BF16)), torch.ldexp),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_mixed_dtype_operands_give_cpu_result(name):
    inputs, fn = CASES[name]
    args = inputs()
    with no_fallback():
        out = run_both(fn, *args, atol=1e-6, rtol=1e-6)
    assert out.dtype == fn(*args).dtype


def test_normal_of_float32_mean_and_float64_std_is_float32():
    mean, std = _t(3, 4).to("tpu"), _t(3, 4, dtype=F64).abs().to("tpu")
    out = torch.normal(mean, std)
    assert out.dtype == torch.normal(mean.cpu(), std.cpu()).dtype == F32
    assert torch.isfinite(out.cpu()).all()
