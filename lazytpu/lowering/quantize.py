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
is in float32 (float64 for a float64 input), as CPU's kernel computes it; the
output's product is a float32 one per tensor, a double one per channel. What
is not a number quantizes as on CPU: per tensor CPU clamps before converting
to an integer (``fmax`` takes a NaN to ``quant_min``), per channel it converts
first, and x86 converts a NaN, an infinity or a value past int64 to INT64_MIN
(then clamped to ``quant_min``; outside the mask).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from lazytpu.lowering.elementwise import divide_exactly
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten

FAKE_QUANTIZE = (  # the ops below (lazytpu.frontend.fake_quant gives them their shapes and CPU's errors)
    aten.fake_quantize_per_tensor_affine_cachemask.default,
    aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams.default,
    aten.fake_quantize_per_channel_affine_cachemask.default,
    aten._fake_quantize_learnable_per_tensor_affine.default,
    aten._fake_quantize_learnable_per_tensor_affine_backward.default,
    aten._fake_quantize_learnable_per_channel_affine.default,
    aten._fake_quantize_learnable_per_channel_affine_backward.default,
)


def _x86_int64(v):
    """``static_cast<int64_t>`` (or ``lrint``) of a whole float as on x86: a NaN, an infinity or a value past
    int64's range becomes INT64_MIN (the conversion's "integer indefinite" value)."""
    return jnp.where(jnp.abs(v) < 2.0**63, v, -(2.0**63))


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
    if per_channel:  # cast to an integer before the clamp: a NaN or an infinity becomes INT64_MIN, then quant_min
        q = _x86_int64(q)
    mask = (q >= quant_min) & (q <= quant_max)
    q = jnp.where(jnp.isnan(q), quant_min, q)  # per tensor, clamped by fmax and fmin before the cast: NaN to quant_min
    # per tensor, ``(q - zero_point) * scale`` is a float32 product (int64 times float); per channel, fmin and
    # fmax make q a double: the difference (with a floating zero point) and the product are double ones
    out_type = jnp.float64 if per_channel else jnp.float32
    out = (jnp.clip(q, quant_min, quant_max).astype(out_type) - zero_point.astype(out_type)) * scale.astype(out_type)
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
    shape = _channel_shape(x.ndim, axis)
    return _fake_quantize(x, scale.reshape(shape), zero_point.reshape(shape), quant_min, quant_max, per_channel=True)


def _channel_shape(ndim: int, axis: int) -> list[int]:
    """The shape a vector of one value per channel broadcasts to along ``axis``."""
    shape = [1] * ndim
    shape[axis % ndim] = -1
    return shape


# Note [Fused observer]: ``_fused_moving_avg_obs_fq_helper`` (what
# ``FusedMovingAvgObsFakeQuantize`` calls; QAT's x86 default for weights and
# activations) reads its two switches with ``item()``, a host read per call on
# CPU. Here both branches are computed and chosen by the switches inside the
# program. Observing: the input's minimum and maximum (per row of the input
# with its channel axis first, or of the whole), averaged into the running
# ones in float32 as CPU's loop does (``r + c * (x - r)``; an infinite running
# value, the start, takes the input's); XLA computes the average as one fused
# multiply-add, as CUDA's kernel does, so a running value may be an ulp from
# CPU's (docs/limitations.md, rounding inside a fused program). Fake
# quantizing, from the same running range, is CPU's bit for bit (its divisions
# exact: Note [Exact quotients]): scale and zero point from the running range,
# fbgemm's ``ChooseQuantizationParams`` step by step (float32 where it
# computes in float, the scale included, double where in double: the symmetric
# range, the range widened to hold 0, a zero or too-large reciprocal scale
# replaced by 0.1, a scale below 6.1e-5 raised to it with the range stretched,
# the zero point from the end that adds the smaller error, nudged into
# ``[quant_min, quant_max]`` and rounded half to even), then the fake
# quantization of Note [Fake quantization] with them.


def _choose_qparams(lo, hi, quant_min: int, quant_max: int, symmetric: bool):
    f32, f64 = jnp.float32, jnp.float64
    lo, hi = lo.astype(f32), hi.astype(f32)
    span = quant_max - quant_min
    if symmetric:
        low, high = -(span // 2 + 1), span // 2
        widest = jnp.maximum(jnp.abs(divide_exactly(lo, f32(low))), jnp.abs(divide_exactly(hi, f32(high)))).astype(f64)
        both = (lo < 0) & (hi > 0)
        lo = jnp.where(both, (widest * low).astype(f32), lo)
        hi = jnp.where(both, (widest * high).astype(f32), hi)
    lo, hi = jnp.minimum(lo, f32(0)), jnp.maximum(hi, f32(0))
    scale = divide_exactly(hi.astype(f64) - lo.astype(f64), f64(span)).astype(f32)  # fbgemm's is a float
    scale = jnp.where((scale == 0) | jnp.isinf(divide_exactly(f32(1), scale)), f32(0.1), scale)
    small = np.float32(6.1e-5)
    stretch = divide_exactly(small, scale)
    tiny = scale < small
    lo_tiny = jnp.where(lo == 0, lo, jnp.where(hi == 0, -(small * np.float32(span)), lo * stretch))
    hi_tiny = jnp.where(lo == 0, small * np.float32(span), jnp.where(hi == 0, hi, hi * stretch))
    lo, hi = jnp.where(tiny, lo_tiny, lo), jnp.where(tiny, hi_tiny, hi)
    scale = jnp.where(tiny, small, scale)
    lo_steps, hi_steps = (divide_exactly(t.astype(f64), scale.astype(f64)) for t in (lo, hi))
    from_min = abs(quant_min) + jnp.abs(lo_steps) < abs(quant_max) + jnp.abs(hi_steps)
    zero_point = jnp.where(from_min, quant_min - lo_steps, quant_max - hi_steps)
    if symmetric:
        zero_point = jnp.where((lo < 0) & (hi > 0), (quant_min + quant_max) / 2, zero_point)
    zero_point = jnp.round(jnp.clip(zero_point, quant_min, quant_max))
    return scale, zero_point


def _switch(flag):
    """``flag.item().toInt() != 0``."""
    return flag.reshape(()).astype(jnp.int64) != 0


@lowering(aten._fused_moving_avg_obs_fq_helper_functional.default)
def fused_observer_fake_quantize(
    x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, averaging_const, quant_min, quant_max,
    ch_axis, per_row_fake_quant=False, symmetric_quant=False,
):  # fmt: skip
    """``(output, mask, running_min, running_max, scale, zero_point)`` (Note [Fused observer])."""
    if per_row_fake_quant:  # observing checked ch_axis == 0; the statistics are per channel either way
        rows = jnp.moveaxis(x, ch_axis, 0).reshape(x.shape[ch_axis], -1)
        seen_min, seen_max = rows.min(axis=1), rows.max(axis=1)
        if running_min.size == 0:  # resized to one per channel, from infinities (scale and zero point: from zeros)
            running_min, running_max = jnp.full_like(seen_min, jnp.inf), jnp.full_like(seen_max, -jnp.inf)
            scale, zero_point = (jnp.resize(t, seen_min.shape) if t.size else jnp.zeros(seen_min.shape, t.dtype)
                                 for t in (scale, zero_point))  # fmt: skip
    else:
        seen_min, seen_max = x.min().reshape(running_min.shape), x.max().reshape(running_max.shape)
    c = jnp.asarray(averaging_const, jnp.float32)
    observe = _switch(observer_on)
    running_min, running_max = (
        jnp.where(observe & ~jnp.isinf(r), r + c * (seen - r), jnp.where(observe, seen, r))
        for r, seen in ((running_min, seen_min), (running_max, seen_max))
    )
    new_scale, new_zero_point = _choose_qparams(running_min, running_max, quant_min, quant_max, symmetric_quant)
    on = _switch(fake_quant_on)
    scale = jnp.where(on, new_scale.astype(scale.dtype), scale)
    zero_point = jnp.where(on, new_zero_point.astype(zero_point.dtype), zero_point)
    if per_row_fake_quant:
        out, mask = fake_quantize_per_channel(x, scale, zero_point, ch_axis, quant_min, quant_max)
    else:
        out, mask = _fake_quantize(x, scale.reshape(()), zero_point.reshape(()).astype(jnp.int64), quant_min, quant_max)
    return jnp.where(on, out, x), mask | ~on, running_min, running_max, scale, zero_point


# Note [Learnable fake quantization]: ``_LearnableFakeQuantize`` (LSQ) learns
# its scale and zero point. Forward, CPU's kernels fake quantize with the zero
# point rounded half to even and clamped (per tensor: the first elements of
# the scale and zero point). Backward, per element and in float32, as CPU's
# ``fake_quantize_learnable_*_grad_kernel``: the input rounded as
# ``nearbyint(z + x * (1 / scale))`` with the backward's zero point (per
# tensor ``trunc(clamp(z + 0.5))``, per channel rounded half to even), the
# input's gradient passed inside ``[quant_min, quant_max]``; outside, the
# scale's gradient is ``dy * (quant_min - z)`` (or ``quant_max - z``) and the
# zero point's ``-dy * scale``, both times ``grad_factor``; inside, the
# scale's is ``dy * (fake quantized x - x) / scale * grad_factor`` and the
# zero point's 0. The two are summed over all elements (per tensor) or all
# but the channel axis; the sums' order is XLA's. XLA computes
# ``z + x * (1 / scale)`` as one fused multiply-add where CPU rounds the
# product first (docs/limitations.md): a product within an ulp of a rounding
# tie may round the other way.


def _learnable_grads(dy, x, scale, zero_point, quant_min: int, quant_max: int, grad_factor):
    f32 = jnp.float32
    dy, x, scale, zero_point = (t.astype(f32) for t in (dy, x, scale, zero_point))
    grad_factor = jnp.asarray(grad_factor, f32)
    inv_scale = divide_exactly(f32(1), scale)
    q = _x86_int64(jnp.round(zero_point + x * inv_scale))
    below, above = q < quant_min, q > quant_max
    outside = below | above
    fake = (jnp.clip(q, quant_min, quant_max) - zero_point) * scale
    d_scale = jnp.where(
        outside,
        jnp.where(below, dy * (quant_min - zero_point), dy * (quant_max - zero_point)) * grad_factor,
        dy * (fake - x) * inv_scale * grad_factor,
    )
    d_zero_point = jnp.where(outside, -dy * scale * grad_factor, f32(0))
    return dy * (~outside).astype(f32), d_scale, d_zero_point  # times 0 outside: a NaN or inf stays NaN


def _first(t):
    return t.reshape(-1)[0]


def _rounded_zero_points(zero_point, quant_min, quant_max):
    return jnp.clip(jnp.round(zero_point), quant_min, quant_max)


@lowering(aten._fake_quantize_learnable_per_tensor_affine.default)
def learnable_per_tensor(x, scale, zero_point, quant_min, quant_max, grad_factor=1.0):
    """Note [Learnable fake quantization]."""
    zp = _rounded_zero_points(_first(zero_point).astype(jnp.float32), quant_min, quant_max).astype(jnp.int64)
    return _fake_quantize(x, _first(scale), zp, quant_min, quant_max)[0]


@lowering(aten._fake_quantize_learnable_per_tensor_affine_backward.default)
def learnable_per_tensor_backward(dy, x, scale, zero_point, quant_min, quant_max, grad_factor=1.0):
    """``(dx, dscale, dzero_point)`` (Note [Learnable fake quantization])."""
    if x.size == 0:
        return x, scale, zero_point
    zp = jnp.trunc(jnp.clip(_first(zero_point).astype(jnp.float32) + 0.5, quant_min, quant_max))
    dx, d_scale, d_zero_point = _learnable_grads(dy, x, _first(scale), zp, quant_min, quant_max, grad_factor)
    return dx, d_scale.sum().reshape(1), d_zero_point.sum().reshape(1)


@lowering(aten._fake_quantize_learnable_per_channel_affine.default)
def learnable_per_channel(x, scale, zero_point, axis, quant_min, quant_max, grad_factor=1.0):
    """Note [Learnable fake quantization]."""
    zp = _rounded_zero_points(zero_point, quant_min, quant_max).astype(jnp.int32)
    return fake_quantize_per_channel(x, scale, zp, axis, quant_min, quant_max)[0]


@lowering(aten._fake_quantize_learnable_per_channel_affine_backward.default)
def learnable_per_channel_backward(dy, x, scale, zero_point, axis, quant_min, quant_max, grad_factor=1.0):
    """``(dx, dscale, dzero_point)`` (Note [Learnable fake quantization])."""
    if x.size == 0:
        return x, scale, zero_point
    shape = _channel_shape(x.ndim, axis)
    zp = _rounded_zero_points(zero_point, quant_min, quant_max).reshape(shape)
    dx, d_scale, d_zero_point = _learnable_grads(dy, x, scale.reshape(shape), zp, quant_min, quant_max, grad_factor)
    others = tuple(d for d in range(x.ndim) if d != axis)
    return dx, d_scale.sum(axis=others), d_zero_point.sum(axis=others)
