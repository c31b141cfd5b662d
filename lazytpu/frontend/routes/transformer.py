"""The inference fast path of ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``.

Note [Transformer fast path]: in eval mode without autograd, torch's modules
call ``_native_multi_head_attention`` and ``_transformer_encoder_layer_fwd``
on any device it lists, PrivateUse1 included. Both have CPU and CUDA kernels
only, so they ran on CPU (a fallback that splits the program at every layer).
Their handlers here compose them from recorded ops as CPU's kernels do
(aten/src/ATen/native/transformers: the projections as ``x @ w.T``, ``q``
rescaled by ``1 / sqrt(head_dim)`` after its bias, ``_masked_softmax`` for a
mask, the output projection as ``addmm``), so the layer is part of the
program and its values are CPU's within rounding. The meta kernels check the
arguments first, with torch's errors.
"""

from __future__ import annotations

import numpy as np
import torch

from lazytpu.frontend.record import check_with_meta, handles

aten = torch.ops.aten


def _inverse_sqrt(n: int, dtype: torch.dtype) -> float:
    """``1.0 / std::sqrt(static_cast<scalar_t>(n))`` stored in ``scalar_t``, as CPU's kernel scales ``q``."""
    root = torch.tensor(float(n), dtype=dtype).float().sqrt()
    if dtype in (torch.float16, torch.bfloat16, torch.float32):
        root = root.to(dtype).float()
    return torch.tensor(1.0 / np.float64(root.item()), dtype=dtype).item()


def _projection(query, key, value, embed_dim: int, qkv_weight):
    """``qkv_projection``: one product for self-attention, two or three otherwise."""
    if key is value:
        if query is key:
            return aten.matmul.default(query, aten.t.default(qkv_weight))
        w_q, w_kv = aten.split_with_sizes.default(qkv_weight, [embed_dim, 2 * embed_dim])
        parts = [aten.matmul.default(query, aten.t.default(w_q)), aten.matmul.default(key, aten.t.default(w_kv))]
    else:
        weights = aten.chunk.default(qkv_weight, 3)
        parts = [aten.matmul.default(x, aten.t.default(w)) for x, w in zip((query, key, value), weights)]
    return aten.cat.default(parts, 2)


def _attention(
    query,
    key,
    value,
    embed_dim,
    num_head,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    mask=None,
    need_weights=True,
    average_attn_weights=True,
    mask_type=None,
):
    qkv = _projection(query, key, value, embed_dim, qkv_weight)
    if qkv.numel() == 0:
        return aten.empty_like.default(query), None
    batch, length = qkv.shape[:2]
    head = embed_dim // num_head
    # _transform_bias_rescale_qkv: 3 x (B, heads, T, head_dim), q scaled after its bias
    heads = aten.view.default(aten.add.Tensor(qkv, qkv_bias), [batch, length, 3, num_head, head])
    q, k, v = aten.unbind.int(aten.permute.default(heads, [2, 0, 3, 1, 4]))
    q = aten.mul.Scalar(q, _inverse_sqrt(head, query.dtype))
    scores = aten.matmul.default(q, aten.transpose.int(k, 2, 3))
    if mask is None:
        weights = aten._softmax.default(scores, 3, False)
    else:
        if mask.dtype != torch.bool:
            mask = aten._to_copy.default(mask, dtype=torch.bool)
        weights = aten._masked_softmax.default(scores, mask, 3, mask_type)
    context = aten.matmul.default(weights, v)
    # transform0213_gemm_nt_bias: (B, T, heads * head_dim) through linear
    rows = aten.reshape.default(aten.transpose.int(context, 1, 2), [batch * length, embed_dim])
    out = aten.view.default(aten.addmm.default(proj_bias, rows, aten.t.default(proj_weight)), [batch, length, -1])
    if not need_weights:
        return out, None
    if average_attn_weights:
        weights = aten.div.Scalar(aten.sum.dim_IntList(weights, [1]), num_head)
    return out, weights


@handles(aten._native_multi_head_attention.default)
def native_multi_head_attention(func, args, kwargs):
    """Note [Transformer fast path]."""
    check_with_meta(func, args, kwargs)
    return _attention(*args, **kwargs)


def _norm(x, embed_dim, eps, weight, bias):
    return aten.layer_norm.default(x, [embed_dim], weight, bias, eps)


def _linear(x, weight, bias, use_gelu=None):
    """``linear_for_ffn``: ``addmm`` over the flattened batch, with a fused activation in the first."""
    rows = aten.view.default(x, [x.shape[0] * x.shape[1], x.shape[2]])
    if use_gelu is None:
        out = aten.addmm.default(bias, rows, aten.t.default(weight))
    else:
        out = aten._addmm_activation.default(bias, rows, aten.t.default(weight), use_gelu=use_gelu)
    return aten.view.default(out, [x.shape[0], x.shape[1], -1])


def _encoder_layer(
    src,
    embed_dim,
    num_heads,
    qkv_weight,
    qkv_bias,
    proj_weight,
    proj_bias,
    use_gelu,
    norm_first,
    layer_norm_eps,
    layer_norm_weight_1,
    layer_norm_bias_1,
    layer_norm_weight_2,
    layer_norm_bias_2,
    ffn_weight_1,
    ffn_bias_1,
    ffn_weight_2,
    ffn_bias_2,
    mask=None,
    mask_type=None,
):
    if src.numel() == 0:
        return aten.clone.default(src)
    x = _norm(src, embed_dim, layer_norm_eps, layer_norm_weight_1, layer_norm_bias_1) if norm_first else src
    x, _ = aten._native_multi_head_attention.default(
        x, x, x, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, mask, False, True, mask_type
    )
    x = aten.add.Tensor(x, src)
    if not norm_first:
        x = _norm(x, embed_dim, layer_norm_eps, layer_norm_weight_1, layer_norm_bias_1)
    residual = x
    if norm_first:
        x = _norm(x, embed_dim, layer_norm_eps, layer_norm_weight_2, layer_norm_bias_2)
    x = _linear(_linear(x, ffn_weight_1, ffn_bias_1, use_gelu), ffn_weight_2, ffn_bias_2)
    x = aten.add.Tensor(x, residual)
    if not norm_first:
        x = _norm(x, embed_dim, layer_norm_eps, layer_norm_weight_2, layer_norm_bias_2)
    return x


@handles(aten._transformer_encoder_layer_fwd.default)
def transformer_encoder_layer(func, args, kwargs):
    """Note [Transformer fast path]."""
    check_with_meta(func, args, kwargs)
    return _encoder_layer(*args, **kwargs)
