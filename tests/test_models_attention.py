"""``F.scaled_dot_product_attention`` on ``tpu``: one fused op forward and backward
(Note [SDPA on PrivateUse1]), against CPU torch."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import no_fallback, run_both

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


_LAYOUTS = {  # CPU: the query's layout from its flash kernel, a contiguous one from its math kernel
    "contiguous": lambda q: q,
    "heads_inner": lambda q: q.transpose(1, 2).contiguous().transpose(1, 2),
    "heads_inner_dropout": lambda q: q.transpose(1, 2).contiguous().transpose(1, 2),
    "heads_inner_value_dims": lambda q: q.transpose(1, 2).contiguous().transpose(1, 2),
    "features_outer": lambda q: q.mT.contiguous().mT,
    "unbatched": lambda q: q[0],  # CPU's math kernel, as on tpu
    "heads_inner_unbatched": lambda q: q[0].transpose(0, 1).contiguous().transpose(0, 1),
}


@pytest.mark.parametrize("layout", sorted(_LAYOUTS))
def test_sdpa_output_has_cpus_layout(layout):
    """The output's strides are CPU's (Note [Attention layouts]), so that a
    ``.view`` of it works, or fails, as on CPU; the gradients' too where both
    run the same kernel (the fused op's gradients are CPU's flash kernel's)."""

    def run(d):
        torch.manual_seed(0)
        q, k, v = (_LAYOUTS[layout](t.detach()).to(d).requires_grad_() for t in _qkv(2, 4, 5, 8, kv_len=7))
        if layout.endswith("value_dims"):
            v = v[..., :6].detach().requires_grad_()
        dropout = 1.0 if layout.endswith("dropout") else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=layout.endswith("unbatched"))
        grads = torch.autograd.grad(out.sum(), (q, k, v))  # as computed (``.grad`` takes the leaf's layout)
        return out.stride(), [g.stride() for g in grads]

    (out, grads), (cpu_out, cpu_grads) = run("tpu"), run("cpu")
    assert out == cpu_out
    if layout in ("contiguous", "heads_inner") or layout.endswith("unbatched"):
        assert grads == cpu_grads


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


def test_sdpa_bias_gradient_through_a_view():
    """A learned bias reaching the op through a view (BEiT's relative position
    bias, ``bias.unsqueeze(0)``): the op's meta kernel pads its gradient's last
    dim to 16 as CUDA's kernel does; the view's backward read the wrong elements."""
    q, k, v = _qkv(2, 4, 5, 8, kv_len=7)
    bias = torch.randn(4, 5, 7, generator=torch.Generator().manual_seed(3)).requires_grad_()
    run_both(
        lambda q, k, v, b: F.scaled_dot_product_attention(q, k, v, attn_mask=b.unsqueeze(0)), q, k, v, bias, grad=True
    )
    strides = []
    for d in ("cpu", "tpu"):
        mask = bias.detach().to(d)[None].requires_grad_()
        out = F.scaled_dot_product_attention(*(t.detach().to(d) for t in (q, k, v)), attn_mask=mask)
        strides.append(torch.autograd.grad(out.sum(), mask)[0].stride())
    assert strides[1] == strides[0] == (140, 35, 7, 1)  # CPU's dense gradient, not CUDA's padded one


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


@pytest.mark.parametrize(
    "shapes",
    [((5, 4, 6), (5, 3, 6), (4, 3)), ((4, 6), (3, 6), (4, 3)), ((1, 2, 4, 6), (3, 2, 3, 6), (3, 1, 4, 3))],
    ids=["3d", "unbatched", "broadcast_batch"],
)
def test_sdpa_boolean_mask_off_the_fused_path(shapes):
    """Inputs the fused op does not take go to torch's math kernel, which wants an additive mask: a
    boolean one was added as 0/1 (values off by up to 2.4); it is converted as torch's C++ does."""
    gen = torch.Generator().manual_seed(3)
    q, k = (torch.randn(s, generator=gen).requires_grad_() for s in shapes[:2])
    v = torch.randn(shapes[1], generator=gen).requires_grad_()
    mask = torch.rand(shapes[2], generator=gen) > 0.4
    mask[..., 0] = True
    run_both(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.device)), q, k, v, grad=True)


def test_sdpa_kernel_choice_is_honoured():
    """``sdpa_kernel`` restricts the kernels as on CPU: math alone refuses a mask with ``is_causal`` (tpu's
    fused op took it), no kernel at all is torch's error; a fused backend (any: the tpu op stands for
    CUDA's flash, efficient and cuDNN kernels) keeps the fused op."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (t.detach().to("tpu") for t in _qkv(1, 2, 4, 8))
    mask = torch.ones(4, 4, dtype=torch.bool, device="tpu")
    with sdpa_kernel([SDPBackend.MATH]), pytest.raises(RuntimeError, match="Explicit attn_mask should not be set"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    with sdpa_kernel([SDPBackend.ERROR]), pytest.raises(RuntimeError, match="No viable backend"):
        F.scaled_dot_product_attention(q, k, v)
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        with sdpa_kernel([backend]):
            assert FUSED in lazytpu.debug.pending_graph(F.scaled_dot_product_attention(q, k, v, is_causal=True))
    with sdpa_kernel([SDPBackend.MATH]):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert FUSED not in lazytpu.debug.pending_graph(out)
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q.cpu(), k.cpu(), v.cpu(), is_causal=True))


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


_Q4, _K4 = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 3, 8)
_CAUSAL_MASK = torch.ones(4, 3, dtype=torch.bool).tril()
_CHECKED_CALLS = {
    # torch's validate_sdpa_input, with its messages (dtype names as C++ prints them)
    "query_1d": lambda d: F.scaled_dot_product_attention(_Q4[0, 0, 0].to(d), _K4[0, 0].to(d), _K4[0, 0].to(d)),
    "int_mask": lambda d: F.scaled_dot_product_attention(_Q4.to(d), _K4.to(d), _K4.to(d), _CAUSAL_MASK.int().to(d)),
    "half_mask": lambda d: F.scaled_dot_product_attention(_Q4.to(d), _K4.to(d), _K4.to(d), _CAUSAL_MASK.half().to(d)),
    "dtypes_2d": lambda d: F.scaled_dot_product_attention(_Q4[0, 0].to(d), _K4[0, 0].double().to(d), _K4[0, 0].to(d)),
    # a mask with is_causal where CPU takes its math kernel: 3-d, dropout
    "mask_and_causal_3d": lambda d: F.scaled_dot_product_attention(
        _Q4[0].to(d), _K4[0].to(d), _K4[0].to(d), _CAUSAL_MASK.to(d), is_causal=True
    ),
    "mask_and_causal_dropout": lambda d: F.scaled_dot_product_attention(
        _Q4.to(d), _K4.to(d), _K4.to(d), _CAUSAL_MASK.to(d), 0.5, is_causal=True
    ),
    # sizes the fused op cannot take: CPU's errors at the call (they failed the program at the next read)
    "head_dims": lambda d: F.scaled_dot_product_attention(_Q4.to(d), _K4[..., :4].to(d), _K4.to(d)),
    "heads": lambda d: F.scaled_dot_product_attention(_Q4.to(d), _K4[:, :1].expand(2, 4, 3, 8).to(d), _K4.to(d)),
    "batch": lambda d: F.scaled_dot_product_attention(
        _Q4.to(d), _K4.expand(2, 2, 3, 8)[:1].repeat(3, 1, 1, 1).to(d), _K4.to(d)
    ),
    "mask_shape": lambda d: F.scaled_dot_product_attention(
        _Q4.to(d), _K4.to(d), _K4.to(d), torch.ones(5, 3, dtype=torch.bool).to(d)
    ),
    "gqa_heads": lambda d: F.scaled_dot_product_attention(
        torch.randn(1, 3, 4, 8).to(d), _K4[:1].to(d), _K4[:1].to(d), enable_gqa=True
    ),
}


@pytest.mark.parametrize("call", _CHECKED_CALLS.values(), ids=_CHECKED_CALLS)
def test_sdpa_checks_its_inputs_as_cpu(call):
    """Each call raises CPU's error at the call; they computed a value (a 1-d
    query, a mask of another dtype, a mask with is_causal) or failed to lower."""
    with pytest.raises(RuntimeError) as cpu_err:
        call("cpu")
    with pytest.raises(RuntimeError) as tpu_err:
        call("tpu")
    assert str(tpu_err.value) == str(cpu_err.value)


def test_sdpa_broadcasts_and_empty_sequences_as_cpu():
    """Sizes CPU broadcasts (a key batch of one, a mask of fewer dims) or keeps
    empty run torch's math kernel on tpu, with CPU's values; a mask with
    is_causal on 4-d inputs is CPU's flash kernel's (both applied)."""
    bias = torch.rand(2, 1, 3)
    calls = [
        lambda d: F.scaled_dot_product_attention(_Q4[:1].to(d), _K4.to(d), _K4.to(d)),
        lambda d: F.scaled_dot_product_attention(_Q4.to(d), _K4[:1].to(d), _K4[:1].to(d)),
        lambda d: F.scaled_dot_product_attention(_Q4.to(d), _K4[:, :, :0].to(d), _K4[:, :, :0].to(d)),
        lambda d: F.scaled_dot_product_attention(_Q4.to(d), _K4.to(d), _K4.to(d), _CAUSAL_MASK.to(d), is_causal=True),
        lambda d: F.scaled_dot_product_attention(_Q4.to(d), _K4.to(d), _K4.to(d), bias.to(d)),
    ]
    for call in calls:
        torch.testing.assert_close(call("tpu").cpu(), call("cpu"))


def test_transformer_encoder_nested_fast_path_says_what_to_do():
    """The encoder's inference fast path with a padding mask makes a strided
    nested tensor, which tpu cannot hold: a NotImplementedError that names the
    option, where it failed with "NestedTensorImpl doesn't support sizes"; with
    the option, CPU's values at every unpadded position."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    x = torch.rand(2, 5, 8)
    pad = torch.tensor([[False, False, False, False, True], [False, False, False, True, True]])
    with torch.no_grad():
        want = encoder(x, src_key_padding_mask=pad)
        on_tpu = copy.deepcopy(encoder).to("tpu")
        with pytest.raises(NotImplementedError, match="enable_nested_tensor=False"):
            on_tpu(x.to("tpu"), src_key_padding_mask=pad.to("tpu"))
        dense = nn.TransformerEncoder(copy.deepcopy(layer), 2, enable_nested_tensor=False).eval()
        dense.load_state_dict(encoder.state_dict())
        got = dense.to("tpu")(x.to("tpu"), src_key_padding_mask=pad.to("tpu")).cpu()
    torch.testing.assert_close(got[~pad], want[~pad])


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


# -- the inference fast path of nn.MultiheadAttention / nn.TransformerEncoderLayer -----------


@pytest.mark.parametrize(
    ("mask", "dim", "mask_type"),
    [("square", 3, 0), ("padding", 3, 1), ("full", 3, 2), ("full", 2, None), ("square", 2, 0), ("padding", 1, 1)],
)
def test_masked_softmax_matches_cpu(mask, dim, mask_type):
    """``_masked_softmax`` (no CPU kernel reached tpu: it fell back): CPU's values,
    NaN for a row masked whole as on CPU."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, 4, 4, generator=gen)
    shapes = {"square": (4, 4), "padding": (2, 4), "full": (2, 2, 4, 4)}
    m = torch.rand(shapes[mask], generator=gen) > 0.6
    m[(0,) * m.dim()] = True
    if mask == "square":
        m[1] = True  # a row masked whole
    with no_fallback():
        got = torch._masked_softmax(x.to("tpu"), m.to("tpu"), dim, mask_type).cpu()
    torch.testing.assert_close(got, torch._masked_softmax(x, m, dim, mask_type), equal_nan=True)
    grad = torch.randn(x.shape, generator=gen)
    full = m.view(1, 1, 4, 4).expand(x.shape) if mask == "square" else m
    if mask == "full" and dim == 3:
        out = torch._masked_softmax(x, full, dim, 2)
        with no_fallback():
            got = aten._masked_softmax_backward(grad.to("tpu"), out.to("tpu"), full.to("tpu"), dim).cpu()
        torch.testing.assert_close(got, aten._masked_softmax_backward(grad, out, full, dim), equal_nan=True)


@pytest.mark.parametrize(
    "call",
    [
        lambda d: torch._masked_softmax(torch.ones(1, 1, 3, 3, device=d), torch.ones(3, 3, device=d), 3, 0),
        lambda d: torch._masked_softmax(
            torch.ones(1, 1, 3, 3, device=d), torch.ones(3, 2, dtype=torch.bool, device=d), 3, 0
        ),
        lambda d: torch._masked_softmax(
            torch.ones(1, 1, 3, 3, device=d), torch.ones(3, 3, dtype=torch.bool, device=d), 3
        ),
        lambda d: torch._masked_softmax(torch.ones(2, 3, device=d), torch.ones(3, 3, dtype=torch.bool, device=d), 1, 2),
    ],
)
def test_masked_softmax_errors_as_on_cpu(call):
    with pytest.raises(RuntimeError) as cpu:
        call("cpu")
    with pytest.raises(RuntimeError, match=re.escape(str(cpu.value))):
        call("tpu")


def _copies(module):
    return module.eval(), copy.deepcopy(module).to("tpu")


@pytest.mark.parametrize(("norm_first", "activation"), [(False, "relu"), (True, "gelu")])
@pytest.mark.parametrize("mask", [None, "src_key_padding_mask", "mask"])
def test_transformer_encoder_fast_path_runs_on_the_device(norm_first, activation, mask):
    """(Note [Transformer fast path]) An eval-mode encoder under no_grad calls
    ``_transformer_encoder_layer_fwd``, which ran on CPU; its layers are recorded now."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, 0.0, activation, batch_first=True, norm_first=norm_first)
    cpu, tpu = _copies(nn.TransformerEncoder(layer, 2, enable_nested_tensor=False))
    x = torch.randn(3, 7, 16)
    masks = {"src_key_padding_mask": torch.arange(7).expand(3, 7) >= torch.tensor([[7], [5], [2]])}
    masks["mask"] = nn.Transformer.generate_square_subsequent_mask(7)
    kwargs = {} if mask is None else {mask: masks[mask]}
    with torch.no_grad(), no_fallback():
        got = tpu(x.to("tpu"), **{k: v.to("tpu") for k, v in kwargs.items()}).cpu()
    with torch.no_grad():
        torch.testing.assert_close(got, cpu(x, **kwargs))


@pytest.mark.parametrize(("need_weights", "average"), [(True, True), (True, False), (False, True)])
def test_multihead_attention_fast_path_runs_on_the_device(need_weights, average):
    """``_native_multi_head_attention`` from the module (self-attention), with and without weights."""
    torch.manual_seed(0)
    cpu, tpu = _copies(nn.MultiheadAttention(16, 4, batch_first=True))
    q = torch.randn(2, 5, 16)
    q_tpu = q.to("tpu")  # the fast path asks `query is key is value`
    with torch.no_grad(), no_fallback():
        out, weights = tpu(q_tpu, q_tpu, q_tpu, need_weights=need_weights, average_attn_weights=average)
    with torch.no_grad():
        want, want_weights = cpu(q, q, q, need_weights=need_weights, average_attn_weights=average)
    torch.testing.assert_close(out.cpu(), want)
    assert (weights is None) == (want_weights is None)
    if weights is not None:
        torch.testing.assert_close(weights.cpu(), want_weights)


@pytest.mark.parametrize("inputs", ["self", "shared_kv", "three"])
@pytest.mark.parametrize("mask_type", [None, 0, 1])
def test_native_multi_head_attention_projections_and_masks(inputs, mask_type):
    """The op itself: one, two or three input projections (CPU's ``qkv_projection``), masks of each type."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 5, 8, generator=gen) for _ in range(3))
    k, v = {"self": (q, q), "shared_kv": (k, k), "three": (k, v)}[inputs]
    weights = [torch.randn(s, generator=gen) for s in ((24, 8), (24,), (8, 8), (8,))]
    mask = {None: None, 0: torch.rand(5, 5, generator=gen) > 0.7, 1: torch.rand(2, 5, generator=gen) > 0.7}[mask_type]

    def call(q, k, v):
        on = [w.to(q.device) for w in weights] + [None if mask is None else mask.to(q.device)]
        return torch._native_multi_head_attention(q, k, v, 8, 2, *on, True, False, mask_type)

    tpu = {id(t): t.to("tpu") for t in (q, k, v)}
    with no_fallback():
        out, attn = call(tpu[id(q)], tpu[id(k)], tpu[id(v)])
    want, want_attn = call(q, k, v)
    torch.testing.assert_close(out.cpu(), want, equal_nan=True, rtol=2e-5, atol=5e-5)  # scores of size ~10
    torch.testing.assert_close(attn.cpu(), want_attn, equal_nan=True)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _relative_bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * 0.01


@pytest.mark.usefixtures("fresh_dynamo")
def test_flex_attention_runs_on_tpu_as_on_cpu():
    """``flex_attention`` refused tpu before running (its list of devices, Note [FlexAttention on
    tpu]): a block mask and a ``score_mod`` give CPU's outputs, the gradients are causal attention's
    (CPU's flex has none), and a ``fullgraph`` compile has no graph break; other devices keep the error."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    q, k, v = _qkv(1, 2, 128, 16)
    on_tpu = [x.detach().to("tpu").requires_grad_() for x in (q, k, v)]
    mask = create_block_mask(_causal, 1, 1, 128, 128, device="tpu")
    out = flex_attention(*on_tpu, block_mask=mask)
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, k, v, is_causal=True))
    with torch.no_grad():
        expected = flex_attention(q.detach(), k.detach(), v.detach(), score_mod=_relative_bias)  # CPU: no gradients
        torch.testing.assert_close(flex_attention(*on_tpu, score_mod=_relative_bias).cpu(), expected)
        compiled = torch.compile(flex_attention, backend="tpu", fullgraph=True)(*on_tpu, block_mask=mask)
        torch.testing.assert_close(compiled.cpu(), out.detach().cpu())
    out.sum().backward()
    F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    for x, ref in zip(on_tpu, (q, k, v)):
        torch.testing.assert_close(x.grad.cpu(), ref.grad)
    meta = torch.empty(1, 2, 8, 4, device="meta")
    with pytest.raises(ValueError, match="FlexAttention is only supported on CUDA, CPU, HPU, or MPS devices"):
        flex_attention(meta, meta, meta)
