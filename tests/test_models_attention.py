"""``F.scaled_dot_product_attention`` on ``tpu``: one fused op forward and backward
(Note [SDPA on PrivateUse1]), against CPU torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import run_both

import lazytpu

aten = torch.ops.aten
# Without dropout, the efficient-attention op; with it, the overrideable one (Note [Attention dropout]).
FUSED = "aten._scaled_dot_product_efficient_attention.default"
FUSED_BACKWARD = "aten._scaled_dot_product_efficient_attention_backward.default"
FUSED_DROPOUT = "aten._scaled_dot_product_fused_attention_overrideable.default"
FUSED_DROPOUT_BACKWARD = "aten._scaled_dot_product_fused_attention_overrideable_backward.default"


def _qkv(*shape, kv_heads=None, kv_len=None):
    gen = torch.Generator().manual_seed(0)
    *lead, heads, length, dim = shape
    kv_shape = (*lead, kv_heads or heads, kv_len or length, dim)
    return [torch.randn(s, generator=gen).requires_grad_() for s in (shape, kv_shape, kv_shape)]


_MASK = torch.rand(5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
_BIAS = torch.randn(2, 1, 5, 7, generator=torch.Generator().manual_seed(2))

CASES = {
    "plain": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v), dict(kv_len=7)),
    "causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), {}),
    "causal_rectangular": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), dict(kv_len=7)),
    "bool_mask": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=_MASK.to(q.device)),
        dict(kv_len=7),
    ),
    "float_mask_scale": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=_BIAS.to(q.device), scale=0.3),
        dict(kv_len=7),
    ),
    "gqa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), dict(kv_heads=2)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sdpa_matches_cpu(name):
    fn, kv = CASES[name]
    lazytpu.metrics.reset()
    run_both(fn, *_qkv(2, 4, 5, 8, **kv), grad=True)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


@pytest.mark.parametrize("dropout_p", [0.0, 1.0])
def test_sdpa_learnable_bias_gradient(dropout_p):
    """Both ops give the mask its gradient (dropout_p=1 drops everything: zeros, on CPU too)."""
    q, k, v = _qkv(2, 4, 5, 8, kv_len=7)
    bias = _BIAS.clone().requires_grad_()
    run_both(
        lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b, dropout_p=dropout_p),
        q,
        k,
        v,
        bias,
        grad=True,
    )


def test_sdpa_unbatched_and_other_ranks():
    run_both(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), *_qkv(4, 5, 8), grad=True)
    run_both(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), *_qkv(2, 3, 2, 5, 8), grad=True)


def test_sdpa_fully_masked_rows_are_zero():
    mask = torch.ones(5, 5, dtype=torch.bool)
    mask[2] = False
    run_both(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device)),
        *_qkv(1, 2, 5, 8),
        grad=True,
    )


def test_sdpa_bfloat16():
    q, k, v = (t.detach().to(torch.bfloat16).requires_grad_() for t in _qkv(2, 4, 5, 8))
    run_both(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, grad=True)


@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_sdpa_records_one_op_each_way(dropout_p):
    forward, backward = (FUSED_DROPOUT, FUSED_DROPOUT_BACKWARD) if dropout_p else (FUSED, FUSED_BACKWARD)
    q, k, v = (t.detach().to("tpu").requires_grad_() for t in _qkv(2, 4, 5, 8))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
    assert lazytpu.debug.pending_graph(out).count("aten.") == 1
    assert forward in lazytpu.debug.pending_graph(out)
    out.sum().backward()
    graph = lazytpu.debug.pending_graph(q.grad, k.grad, v.grad)
    assert graph.count(backward) == 1 and "_softmax" not in graph


def test_sdpa_dropout_scales_kept_probabilities():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 256, 16, generator=gen).to("tpu")
    ones = torch.ones(1, 1, 256, 16, device="tpu")
    out = F.scaled_dot_product_attention(q, q, ones, dropout_p=0.25).cpu()
    # each row of probabilities sums to 1 before dropout: after it, 1 in expectation
    assert abs(out.mean().item() - 1) < 0.05
    assert out.std().item() > 0.01  # something was dropped
    no_dropout = F.scaled_dot_product_attention(q, q, ones, dropout_p=0.0).cpu()
    torch.testing.assert_close(no_dropout, torch.ones_like(no_dropout))


def test_sdpa_dropout_backward_uses_the_forward_mask():
    """The output is linear in ``v``: sum(out * g) equals sum(grad_v * v) only if the
    backward rebuilt the forward's dropout mask (Note [Attention dropout])."""
    q, k, v = (t.detach().to("tpu").requires_grad_() for t in _qkv(1, 2, 6, 4))
    grad_out = torch.randn(1, 2, 6, 4, generator=torch.Generator().manual_seed(3)).to("tpu")
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    out.backward(grad_out)
    lhs = (out.detach() * grad_out).sum().item()
    rhs = (v.grad * v.detach()).sum().item()
    assert abs(lhs - rhs) < 1e-4 * max(1.0, abs(lhs))


def test_sdpa_dropout_is_reproducible_under_manual_seed():
    q, k, v = (t.detach().to("tpu") for t in _qkv(1, 2, 6, 4))
    torch.manual_seed(5)
    first = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu()
    torch.manual_seed(5)
    second = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu()
    third = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).cpu()
    assert torch.equal(first, second)
    assert not torch.equal(first, third)


def test_sdpa_mismatched_dtypes_raise_like_cpu():
    q, k, v = _qkv(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same dtype"):
        F.scaled_dot_product_attention(q.detach(), k.detach().double(), v.detach())
    with pytest.raises(RuntimeError, match="Expected query, key, and value to have the same dtype"):
        F.scaled_dot_product_attention(q.detach().to("tpu"), k.detach().double().to("tpu"), v.detach().to("tpu"))


def test_sdpa_backward_of_an_undefined_output_gradient_is_zero():
    """gradcheck's ``check_undefined_grad`` (PyTorch's test_modules: the Transformer layers) passes
    no output gradient to the attention backward; it lowered ``None.astype`` before."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 2, dtype=torch.float64).to("tpu").requires_grad_() for _ in range(3))
    mask = torch.randn(3, 3, dtype=torch.float64).to("tpu").requires_grad_()
    for attn_mask in (None, mask):
        assert torch.autograd.gradcheck(
            lambda a, b, c, m=attn_mask: F.scaled_dot_product_attention(a, b, c, attn_mask=m),
            (q, k, v),
            check_undefined_grad=True,
            nondet_tol=1e-15,  # docs/limitations.md, "Rounding inside a fused program"
        )
