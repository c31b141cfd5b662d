"""Ops outside the other families: complex-number builders and pairwise
distances.

``view_as_real``/``view_as_complex`` are views in torch whose dtype differs
from their base's, so the dispatcher computes them as values (they share no
storage here: writing through one does not reach the base).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from lazytpu.lowering.norms import p_norm
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


# -- complex numbers -----------------------------------------------------------


@lowering(aten.view_as_real.default)
def view_as_real(z):
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1)


@lowering(aten.view_as_complex.default)
def view_as_complex(x):
    return complex_(x[..., 0], x[..., 1])


@lowering(aten.complex.default)
def complex_(real, imag):
    real, imag = jnp.broadcast_arrays(real, imag)
    if real.dtype == jnp.float16:  # complex32 result, stored as complex64 (Note [complex32 storage])
        real, imag = real.astype(jnp.float32), imag.astype(jnp.float32)
    return lax.complex(real, imag)


@lowering(aten.polar.default)
def polar(magnitude, angle):
    magnitude, angle = jnp.broadcast_arrays(magnitude, angle)
    return lax.complex(magnitude * jnp.cos(angle), magnitude * jnp.sin(angle))


# -- pairwise distances ----------------------------------------------------------


def _pdist(x, p):
    """Distances between rows ``i < j`` of ``x`` (row-major over the pairs)."""
    n = x.shape[0]
    rows, cols = jnp.triu_indices(n, k=1)
    return p_norm(jnp.abs(x[rows] - x[cols]), p, (1,), False)


@lowering(aten._pdist_forward.default)
def pdist(x, p=2.0):
    return _pdist(x, p)


@lowering(aten._pdist_backward.default)
def pdist_backward(grad, x, p, distances):
    _, pullback = jax.vjp(lambda v: _pdist(v, p), x)
    return pullback(grad)[0]


# -- segments and hashes -------------------------------------------------------


def _runs(data, lengths, offsets, axis: int):
    """Which elements of ``data`` along ``axis`` each run holds (``lead + (S, N) + (1,) * rest``),
    and ``data`` with a runs axis (``lead + (1, N) + rest``)."""
    if offsets is None:
        zero = jnp.zeros(lengths.shape[:-1] + (1,), lengths.dtype)
        offsets = jnp.concatenate([zero, jnp.cumsum(lengths, axis=-1)], axis=-1)
    position = jnp.arange(data.shape[axis])
    inside = (offsets[..., :-1, None] <= position) & (position < offsets[..., 1:, None])
    return inside.reshape(inside.shape + (1,) * (data.ndim - axis - 1)), jnp.expand_dims(data, axis)


_EXTREMES = {"amax": "max", "amin": "min"}  # torch's other names of max and min (ReductionType.h)


def _segment_reduce(data, reduce: str, lengths, offsets, axis: int, initial):
    """Reduce runs of ``data`` along ``axis`` (one run per length, or between
    consecutive offsets; batched over the dims before ``axis``). ``initial``
    joins every run; an empty run without it is torch's identity (NaN for mean)."""
    inside, x = _runs(data, lengths, offsets, axis)
    count = jnp.sum(inside, axis=axis + 1).astype(data.dtype)
    if reduce in ("sum", "mean"):
        total = jnp.sum(jnp.where(inside, x, 0), axis=axis + 1)
        if initial is not None:
            total = total + initial
        if reduce == "sum":
            return total
        return total / (jnp.maximum(count, 1) if initial is not None else count)
    if reduce == "prod":
        out = jnp.prod(jnp.where(inside, x, 1), axis=axis + 1)
        return out if initial is None else out * initial
    big = jnp.inf if jnp.issubdtype(data.dtype, jnp.floating) else jnp.iinfo(data.dtype).max
    if reduce == "max":
        out = jnp.max(jnp.where(inside, x, -big), axis=axis + 1, initial=-big)
        return out if initial is None else jnp.maximum(out, initial)
    out = jnp.min(jnp.where(inside, x, big), axis=axis + 1, initial=big)
    return out if initial is None else jnp.minimum(out, initial)


def _segment_extreme_backward(grad, output, data, lengths, offsets, axis: int):
    """CPU's max/min backward (``_segment_reduce_lengths_offsets_backward_cpu_kernel``):
    each element of a run equal to its result, or NaN, gets the run's gradient;
    where two or more do, the positive ones are divided by their count."""
    inside, x = _runs(data, lengths, offsets, axis)
    hit = inside & (jnp.isnan(x) | (x == jnp.expand_dims(output, axis + 1)))
    each = jnp.where(hit, jnp.expand_dims(grad, axis + 1), 0).astype(grad.dtype)
    count = jnp.sum(hit, axis=axis + 1, keepdims=True)
    each = jnp.where((count >= 2) & (each > 0), each / count.astype(grad.dtype), each)
    return jnp.sum(each, axis=axis)  # runs do not overlap: one term per element


@lowering(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    return _segment_reduce(data, _EXTREMES.get(reduce, reduce), lengths, offsets, axis % data.ndim, initial)


@lowering(aten._segment_reduce_backward.default)
def segment_reduce_backward(grad, output, data, reduce, *, lengths=None, offsets=None, axis=0, initial=None):
    reduce = _EXTREMES.get(reduce, reduce)
    if reduce in ("max", "min"):
        return _segment_extreme_backward(grad, output, data, lengths, offsets, axis % data.ndim)
    _, pullback = jax.vjp(lambda d: _segment_reduce(d, reduce, lengths, offsets, axis % data.ndim, initial), data)
    return pullback(grad)[0]


@lowering(aten.hash_tensor.default)
def hash_tensor(x, dim=(), *, keepdim=False, mode=0):
    """XOR of the values' bits: floats as float64, integers as int64 (mode 0)."""
    wide = jnp.float64 if jnp.issubdtype(x.dtype, jnp.floating) else jnp.int64
    bits = lax.bitcast_convert_type(x.astype(wide), jnp.uint64)
    if x.ndim == 0:  # a 0-d input is its own hash; dim 0 and -1 name it (as for sum)
        return bits
    axes = tuple(range(x.ndim)) if not dim else tuple(sorted({d % x.ndim for d in dim}))
    out = lax.reduce(bits, jnp.uint64(0), lax.bitwise_xor, axes)
    return jnp.expand_dims(out, axes) if keepdim else out
