"""linalg_vector_norm (Tensor.norm, clip_grad_norm_) against CPU torch."""

from __future__ import annotations

import pytest
import torch
from conftest import run_both

import lazytpu


@pytest.mark.parametrize("ord", [2, 1, float("inf"), float("-inf"), 0, 3.5])
@pytest.mark.parametrize("dim", [None, 1, (0, 1)])
def test_vector_norm_matches_cpu(ord, dim):
    lazytpu.metrics.reset()
    x = torch.randn(4, 5, requires_grad=ord not in (0,))
    run_both(lambda t: torch.linalg.vector_norm(t, ord, dim), x, grad=ord not in (0, float("inf"), float("-inf")))
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


def test_norm_with_dtype_and_keepdim():
    x = torch.randn(3, 4)
    run_both(lambda t: torch.linalg.vector_norm(t, 2, 0, keepdim=True, dtype=torch.float64), x)
    run_both(lambda t: t.norm(), x)


@pytest.mark.parametrize("dim", [0, 2, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_weight_norm_gradients_are_recorded(dim, dtype):
    """``_weight_norm_interface``'s backward (wav2vec2's positional convolution
    uses ``weight_norm(dim=2)``) ran on CPU, splitting the program."""
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(4, 3, 5, generator=gen).to(dtype).requires_grad_()
    g = torch.randn({0: (4, 1, 1), 2: (1, 1, 5), -1: ()}[dim], generator=gen).to(dtype).requires_grad_()
    weights = torch.linspace(-2, 2, 60).reshape(4, 3, 5).to(dtype)
    lazytpu.metrics.reset()
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype is torch.bfloat16 else {}
    run_both(lambda v, g, w: torch._weight_norm(v, g, dim) * w, v, g, weights, grad=True, **tol)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}
