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
