"""Factories and conversions: empty, full, fill, arange, linspace, eye, kaiser_window, _to_copy.

``torch.zeros(..., device="tpu")`` and most other factories reach the
dispatcher as ``empty`` followed by an in-place fill (``zero_``, ``fill_``)
or an ``out=`` op (``arange.start_out``, ``eye.m_out``); the dispatcher maps
those to the functional overloads registered here.

Note [Factory arithmetic]: ``arange``, ``linspace`` and ``logspace`` follow
torch's CPU kernels: bounds converted to the result type first, then stepped
in its accumulation type (double for integers; ``arange`` also for floats),
``linspace`` from both ends. Values match CPU torch exactly for ``arange``
and to rounding for the others (torch's vectorized loop rounds per chunk).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from lazytpu import _dtypes
from lazytpu.lowering.casts import convert
from lazytpu.lowering.pointwise_ext import modified_bessel_i0
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def jax_dtype(dtype):
    return _dtypes.to_jax(dtype if dtype is not None else _dtypes.default_float())


def _value_dtype(value, dtype):
    """The dtype of a factory filled with the Python ``value`` (torch's rule)."""
    if dtype is not None:
        return _dtypes.to_jax(dtype)
    if isinstance(value, bool):
        return jnp.bool_
    if isinstance(value, int):
        return jnp.int64
    if isinstance(value, complex):
        return _dtypes.to_jax(torch.complex128 if _dtypes.default_float() == torch.float64 else torch.complex64)
    return jax_dtype(None)


def _like_dtype(x, dtype):
    return x.dtype if dtype is None else _dtypes.to_jax(dtype)


def is_integral(jdtype) -> bool:
    return jnp.issubdtype(jdtype, jnp.integer) or jnp.dtype(jdtype) == jnp.bool_


# -- constant fills ------------------------------------------------------------


@lowering(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    # Uninitialized memory in torch; zeros here (deterministic, and usually dead).
    return jnp.zeros(tuple(size), jax_dtype(dtype))


@lowering(aten.empty_strided)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), jax_dtype(dtype))


@lowering(aten.zeros.default, aten._efficientzerotensor.default)
def zeros(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    # _efficientzerotensor (autograd's "no gradient here", e.g. sgn of a real
    # input) is an ordinary zero tensor on tpu: XLA folds the zeros anyway.
    return jnp.zeros(tuple(size), jax_dtype(dtype))


@lowering(aten.ones.default)
def ones(size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), jax_dtype(dtype))


@lowering(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    dtype = _value_dtype(fill_value, dtype)
    return jnp.broadcast_to(_dtypes.number(fill_value, dtype), tuple(size))


@lowering(aten.empty_like, aten.zeros_like)
def zeros_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(x.shape, _like_dtype(x, dtype))


@lowering(aten.ones_like)
def ones_like(x, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(x.shape, _like_dtype(x, dtype))


@lowering(aten.full_like)
def full_like(x, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.broadcast_to(_dtypes.number(fill_value, _like_dtype(x, dtype)), x.shape)


@lowering(aten.new_empty, aten.new_zeros)
def new_zeros(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _like_dtype(x, dtype))


@lowering(aten.new_empty_strided)
def new_empty_strided(x, size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _like_dtype(x, dtype))


@lowering(aten.new_ones)
def new_ones(x, size, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.ones(tuple(size), _like_dtype(x, dtype))


@lowering(aten.new_full)
def new_full(x, size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.broadcast_to(_dtypes.number(fill_value, _like_dtype(x, dtype)), tuple(size))


@lowering(aten.fill.Scalar)
def fill(x, value):
    return jnp.broadcast_to(_dtypes.number(value, x.dtype), x.shape)


@lowering(aten.fill.Tensor)
def fill_tensor(x, value):
    return jnp.broadcast_to(convert(value, x.dtype), x.shape)


@lowering(aten.zero)
def zero(x):
    return jnp.zeros_like(x)


@lowering(aten.scalar_tensor)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _dtypes.number(s, jax_dtype(dtype))


@lowering(aten.eye)
def eye(n, m=None, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, m, dtype=jax_dtype(dtype))


# -- ranges (Note [Factory arithmetic]) -----------------------------------------


@lowering(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(*bounds, dtype=None, layout=None, device=None, pin_memory=None):
    start, end, step = (0, *bounds, 1) if len(bounds) == 1 else (*bounds, 1)[:3]
    python_ints = all(isinstance(b, int) for b in (start, end, step))
    target = _dtypes.to_jax(dtype) if dtype is not None else (jnp.int64 if python_ints else jax_dtype(None))
    if is_integral(target):
        # torch sizes an int64 range in integers (bounds truncated), others in double
        if jnp.dtype(target) == jnp.int64:
            istart, iend, istep = int(start), int(end), int(step)
            span = iend - istart + istep - (istep > 0) + (istep < 0)
            n = abs(span) // abs(istep) * (1 if (span >= 0) == (istep > 0) else -1)  # C's truncating division
        else:
            n = math.ceil((float(end) - float(start)) / float(step))
        return int(start) + int(step) * jnp.arange(max(n, 0), dtype=jnp.int64)
    # torch's CPU accumulation type of float/half is double.
    n = max(math.ceil((float(end) - float(start)) / float(step)), 0)
    return start + step * jnp.arange(n, dtype=jnp.float64)


def two_sided(lo, hi, steps: int, work):
    """torch's ``linspace`` steps: from ``lo`` in the first half, back from ``hi``
    in the second, so both ends are exact."""
    if steps <= 1:
        return jnp.full((steps,), lo, work)
    step = (hi - lo) / (steps - 1)
    idx = jnp.arange(steps)
    front = lo + step * idx.astype(work)
    back = hi - step * (steps - 1 - idx).astype(work)
    return jnp.where(idx < steps // 2, front, back)


def _bounds(start, end, target, work):
    """``start`` and ``end`` (numbers, or 0-d arrays for the Tensor overloads)
    converted to the result type first, as torch does (integers truncate)."""
    return jnp.asarray(start).astype(target).astype(work), jnp.asarray(end).astype(target).astype(work)


@lowering(aten.linspace.default)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    target = jax_dtype(dtype)
    work = jnp.float64 if is_integral(target) else target  # torch steps in double for integers
    return two_sided(*_bounds(start, end, target, work), steps, work)


@lowering(aten.logspace.default)
def logspace(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    if steps == 1:  # torch fills with base ** start, start unconverted
        return jnp.power(jnp.float64(base), jnp.asarray(start).astype(jnp.float64)).reshape(1)
    exponents = two_sided(*_bounds(start, end, jax_dtype(dtype), jnp.float64), steps, jnp.float64)
    return jnp.power(jnp.float64(base), exponents)


# -- conversions ---------------------------------------------------------------


@lowering(aten.kaiser_window.default, aten.kaiser_window.periodic, aten.kaiser_window.beta)
def kaiser_window(window_length, periodic=True, beta=12.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    """CPU's kernel: ``i0(beta * sqrt(|1 - ((n - alpha) / alpha) ** 2|)) / i0(beta)``
    over a window one longer when periodic, in float32 at least."""
    target = jax_dtype(dtype)
    if window_length <= 1:
        return jnp.ones(window_length, target)
    n = window_length + 1 if periodic else window_length
    work = jnp.promote_types(target, jnp.float32)
    alpha = (n - 1) / 2.0
    ratio = (jnp.arange(n, dtype=target).astype(work) - alpha) / alpha
    i0 = modified_bessel_i0
    window = i0(beta * jnp.sqrt(jnp.abs(1 - ratio * ratio))) / i0(jnp.asarray(beta, work))
    return window[:window_length]


@lowering(aten._to_copy)
def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return x if dtype is None else convert(x, _dtypes.to_jax(dtype))


@lowering(torch.ops.prims.convert_element_type)  # what torch's _refs decompositions cast with
def convert_element_type(x, dtype):
    return convert(x, _dtypes.to_jax(dtype))


@lowering(aten.clone, aten.lift_fresh_copy, aten.alias_copy)
def clone(x, *, memory_format=None):
    return x
