"""Scaled dot-product attention, forward and backward, as single ops.

Note [SDPA on PrivateUse1]: ``F.scaled_dot_product_attention`` is
CompositeImplicit; torch's C++ asks a per-device stub which fused kernel to
use and, for PrivateUse1 backends that choose it, calls
``_scaled_dot_product_fused_attention_overrideable`` (autograd's backward is
``..._overrideable_backward``). A Python backend cannot fill that stub, so
``lazytpu.device.sdpa`` registers ``scaled_dot_product_attention`` for
AutogradPrivateUse1 and calls a fused op itself (Note [Attention dropout]
says which). Without that, the op arrives decomposed into the math reference
(a dozen ops, with the attention matrix saved for backward).

The rules compute ``softmax(q k^T * scale + bias) v`` in float32 for half
inputs (as fused kernels accumulate). Rows whose every key is masked give 0,
as torch's CPU kernel does. ``is_causal`` is torch's
upper-left alignment: query ``i`` sees keys ``j <= i``.

Note [Attention dropout]: the overrideable forward is a random rule; its PRNG
key is returned as ``philox_seed`` (the key's two 32-bit words in one int64)
so the backward rebuilds the same dropout mask. ``dropout_p`` arrives as a
traced scalar, so the mask is drawn under ``lax.cond`` (only when nonzero at
run time), but both branches are compiled, and the PRNG makes XLA:CPU compile
a fwd+bwd pair several times slower. Calls with ``dropout_p == 0`` (inference,
and training of most models) therefore go to
``_scaled_dot_product_efficient_attention`` instead (CUDA's memory-efficient
kernel in torch; autograd's backward is ``..._efficient_attention_backward``,
with the mask's gradient), lowered here without dropout.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten

_HALF = (jnp.bfloat16, jnp.float16)


def _scores(q, k, bias, is_causal, scale):
    """Masked, scaled logits ``(..., Sq, Sk)`` in float32 for half inputs."""
    acc = jnp.float32 if q.dtype in _HALF else q.dtype
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = jnp.einsum("...qd,...kd->...qk", q, k, preferred_element_type=acc) * scale
    if is_causal:
        sq, sk = s.shape[-2:]
        s = jnp.where(jnp.tril(jnp.ones((sq, sk), jnp.bool_)), s, -jnp.inf)
    if bias is not None:
        s = jnp.where(bias, s, -jnp.inf) if bias.dtype == jnp.bool_ else s + bias.astype(acc)
    return s


def _safe_softmax(s):
    """Softmax over the last dim; all-masked rows give zeros and a -inf logsumexp."""
    top = jax.lax.stop_gradient(jnp.max(s, axis=-1, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, 0)
    e = jnp.exp(s - top)
    total = jnp.sum(e, axis=-1, keepdims=True)
    p = jnp.where(total > 0, e / jnp.where(total > 0, total, 1), 0)
    return p, jnp.squeeze(jnp.log(total) + top, -1)


def _dropout(p, key, dropout_p):
    """Note [Attention dropout]."""

    def drop(p):
        keep = jax.random.bernoulli(key, 1 - dropout_p, p.shape)
        scale = jnp.where(dropout_p < 1, 1 / jnp.where(dropout_p < 1, 1 - dropout_p, 1), 0)  # p=1 drops all
        return jnp.where(keep, p * scale, 0).astype(p.dtype)

    return jax.lax.cond(dropout_p > 0, drop, lambda p: p, p)


def attention(q, k, v, bias, dropout_p, is_causal, scale, key):
    """Returns (output, logsumexp) of scaled dot-product attention."""
    p, lse = _safe_softmax(_scores(q, k, bias, is_causal, scale))
    if key is not None:
        p = _dropout(p, key, dropout_p)
    acc = jnp.float32 if q.dtype in _HALF else q.dtype
    out = jnp.einsum("...qk,...kd->...qd", p.astype(v.dtype), v, preferred_element_type=acc)
    return out.astype(q.dtype), lse


def _key_to_seed(key):
    words = key.astype(jnp.int64)
    return (words[0] << 32) | words[1]


def _seed_to_key(seed):
    seed = seed.astype(jnp.int64)
    hi = jax.lax.shift_right_logical(seed, jnp.int64(32))
    return jnp.stack([hi, seed & 0xFFFFFFFF]).astype(jnp.uint32)


def _lse_shape(lse, q):
    """torch's logsumexp is (B, H, Sq) even for 3-d (H, S, E) inputs."""
    return lse if q.ndim == 4 else lse[None]


@lowering(aten._scaled_dot_product_fused_attention_overrideable.default, random=True)
def sdpa_overrideable(
    q, k, v, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None, key
):
    out, lse = attention(q, k, v, attn_bias, dropout_p, is_causal, scale, key)
    return out, _lse_shape(lse, q), _key_to_seed(key), jnp.zeros((), jnp.int64)


def _attention_grads(grad_out, q, k, v, bias, dropout_p, is_causal, seed, scale, bias_grad=True):
    """Gradients of ``attention`` for q, k, v and, when ``bias_grad`` and there is a bias, for it."""
    key = None if seed is None else _seed_to_key(seed)
    float_bias = bias is not None and bias.dtype != jnp.bool_

    def f(q, k, v, b):
        return attention(q, k, v, b if float_bias else bias, dropout_p, is_causal, scale, key)[0]

    out, vjp = jax.vjp(f, q, k, v, bias if float_bias else None)
    if grad_out is None:  # an undefined output gradient (gradcheck's check_undefined_grad): zeros
        grad_out = jnp.zeros_like(out)
    grad_q, grad_k, grad_v, grad_bias = vjp(grad_out.astype(q.dtype))
    if bias is None or not bias_grad:
        return grad_q, grad_k, grad_v
    return grad_q, grad_k, grad_v, grad_bias if float_bias else jnp.zeros(bias.shape, bias.dtype)


@lowering(aten._scaled_dot_product_fused_attention_overrideable_backward.default)
def sdpa_overrideable_backward(
    grad_out,
    q,
    k,
    v,
    attn_bias,
    grad_input_mask,
    out,
    logsumexp,
    cum_seq_q,
    cum_seq_k,
    max_q,
    max_k,
    dropout_p,
    is_causal,
    philox_seed,
    philox_offset,
    *,
    scale=None,
):
    return _attention_grads(grad_out, q, k, v, attn_bias, dropout_p, is_causal, philox_seed, scale)


@lowering(aten._scaled_dot_product_efficient_attention.default)
def sdpa_no_dropout(q, k, v, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
    out, lse = attention(q, k, v, attn_bias, dropout_p, is_causal, scale, None)
    # torch pads logsumexp to a multiple of 32 queries (empty when not asked for).
    pad = -(-q.shape[-2] // 32) * 32 - q.shape[-2] if compute_log_sumexp else -q.shape[-2]
    lse = jax.lax.pad(lse, jnp.asarray(-jnp.inf, lse.dtype), [(0, 0, 0)] * (lse.ndim - 1) + [(0, pad, 0)])
    return out, lse, jnp.zeros((), jnp.int64), jnp.zeros((), jnp.int64)


@lowering(aten._scaled_dot_product_efficient_attention_backward.default)
def sdpa_no_dropout_backward(
    grad_out,
    q,
    k,
    v,
    attn_bias,
    out,
    logsumexp,
    philox_seed,
    philox_offset,
    dropout_p,
    grad_input_mask,
    is_causal=False,
    *,
    scale=None,
):
    return _attention_grads(grad_out, q, k, v, attn_bias, dropout_p, is_causal, None, scale, grad_input_mask[3])
