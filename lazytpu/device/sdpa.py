"""``F.scaled_dot_product_attention`` on ``tpu`` as one fused op (Note [SDPA on PrivateUse1]).

``register`` (called from ``registration.register``) installs ``scaled_dot_product_attention``
for AutogradPrivateUse1: it does what torch's C++ does for a PrivateUse1
backend whose kernel choice is "overrideable", except that calls without
dropout take ``_scaled_dot_product_efficient_attention`` (Note [Attention
dropout]). Autograd records the fused op, and its backward op, as one node each.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
):
    """torch's ``scaled_dot_product_attention`` for ``tpu`` tensors."""
    if not (query.dim() == key.dim() == value.dim() and query.dim() in (3, 4)):
        # The fused ops take (H, S, E) or (B, H, S, E); other ranks use torch's math kernel.
        return aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )[0]
    if not query.dtype == key.dtype == value.dtype:
        raise RuntimeError(
            "Expected query, key, and value to have the same dtype, but got query.dtype: "
            f"{query.dtype} key.dtype: {key.dtype} and value.dtype: {value.dtype} instead."
        )
    if enable_gqa and key.size(-3) != query.size(-3):
        if query.size(-3) % key.size(-3):
            raise RuntimeError("Number of heads in key and value must divide the number of heads in query")
        key = key.repeat_interleave(query.size(-3) // key.size(-3), dim=-3)
        value = value.repeat_interleave(query.size(-3) // value.size(-3), dim=-3)
    if dropout_p == 0:
        # The dropout-free op compiles much faster (Note [Attention dropout] in
        # lowering/attention). Its meta kernel takes 4-d inputs only.
        if query.dim() == 3:
            return scaled_dot_product_attention(
                query[None], key[None], value[None], attn_mask, dropout_p, is_causal, scale=scale
            )[0]
        return aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, False, 0.0, is_causal, scale=scale
        )[0]
    return aten._scaled_dot_product_fused_attention_overrideable(
        query, key, value, attn_mask, dropout_p, is_causal, False, scale=scale
    )[0]


def register(lib: torch.library.Library) -> None:
    """Install the kernel in ``lib`` (an ``aten`` IMPL library)."""
    lib.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradPrivateUse1")
