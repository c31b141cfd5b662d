"""Fake quantization (quantization-aware training): quantize and dequantize in
one step, with the mask of the elements inside the range (their gradient
passes).

Note [Fake quantization]: the rules take CPU torch's steps, so that a value at
a rounding tie rounds as on CPU: the scale in float32, its reciprocal
(``1.0f / scale``, a scalar division, exact), the input times it, rounded half
to even (``nearbyint``), the zero point added after the rounding (a floating
per-channel zero point is added before it, and the sum rounded: ``lrintf``),
the mask of the results inside ``[quant_min, quant_max]``, then the clamped
result less the zero point, times the scale. The product with the reciprocal
is in float32 (float64 for a float64 input), as CPU's kernel computes it.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten

FAKE_QUANTIZE = (  # the ops below (lazytpu.frontend.metas gives them their shapes and CPU's errors)
    aten.fake_quantize_per_tensor_affine_cachemask.default,
    aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default,
    aten.fake_quantize_per_channel_affine_cachemask.default,
)


def _fake_quantize(x, scale, zero_point, quant_min: int, quant_max: int, *, per_channel: bool = False):
    wide = jnp.float64 if x.dtype == jnp.float64 else jnp.float32
    scale = jnp.asarray(scale, jnp.float32)
    product = x.astype(wide) * (jnp.float32(1) / scale).astype(wide)
    floating = jnp.issubdtype(zero_point.dtype, jnp.floating)
    zero_point = zero_point.astype(jnp.float32 if floating else wide)  # a float16 one is added in float32
    if per_channel and floating:  # lrintf: the sum rounded to float32 (from a float64 input's), then to an integer
        q = jnp.round((zero_point + product).astype(jnp.float32)).astype(wide)
    else:
        q = zero_point + jnp.round(product)
    mask = (q >= quant_min) & (q <= quant_max)
    # per tensor, ``(q - zero_point) * scale`` is a float32 product (int64 times float); per channel, a double one
    out_type = wide if per_channel else jnp.float32
    out = (jnp.clip(q, quant_min, quant_max) - zero_point).astype(out_type) * scale.astype(out_type)
    return out.astype(x.dtype), mask


@lowering(aten.fake_quantize_per_tensor_affine_cachemask.default)
def fake_quantize_per_tensor(x, scale, zero_point, quant_min, quant_max):
    return _fake_quantize(x, scale, jnp.asarray(zero_point, jnp.int64), quant_min, quant_max)


@lowering(aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default)
def fake_quantize_per_tensor_qparams(x, scale, zero_point, enabled, quant_min, quant_max):
    """Scale and zero point read as CPU reads them (``item()``: a floating zero
    point truncated); when ``enabled`` is 0, the input itself and a mask of ones."""
    zero_point = zero_point.astype(jnp.int64)  # truncated, as ``item().toInt()``
    out, mask = _fake_quantize(x, scale.reshape(()), zero_point.reshape(()), quant_min, quant_max)
    on = enabled.reshape(()).astype(jnp.int64) != 0
    return jnp.where(on, out, x), mask | ~on


@lowering(aten.fake_quantize_per_channel_affine_cachemask.default)
def fake_quantize_per_channel(x, scale, zero_point, axis, quant_min, quant_max):
    shape = [1] * x.ndim
    shape[axis % x.ndim] = -1
    return _fake_quantize(x, scale.reshape(shape), zero_point.reshape(shape), quant_min, quant_max, per_channel=True)
