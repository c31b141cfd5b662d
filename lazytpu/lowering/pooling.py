"""Pooling: max (with indices), average and adaptive average, 1-3 spatial dims, and their backward.

The 1-d forms (``max_pool1d``, ``avg_pool1d``, ``adaptive_avg_pool1d``) are
CompositeImplicit in torch and arrive as the 2-d ops. Inputs are batched
``(N, C, *spatial)`` or unbatched ``(C, *spatial)``: the 2-d and 3-d rules
pool the last 2 or 3 dims.

Note [Pooling windows]: torch's output size along a dim of size ``n`` is
``(n + 2p - d(k-1) - 1 + (s-1 if ceil_mode)) // s + 1``, minus one when
``ceil_mode`` would start the last window in the right padding. The input is
padded to exactly cover the windows: ``p`` on the left and whatever the last
window needs on the right (which may be less than ``p``, or even crop).

Note [Max pool indices]: indices are flat positions in the input's spatial
plane (``h * W + w``). The window maximum and its index are reduced together
over (value, index) pairs: the larger value wins, NaN beats any number, and
ties go to the smaller index (the first in scan order, as torch's kernels).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax import lax

from lazytpu import _dtypes
from lazytpu.lowering.reduction import upcast
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _params(values, nd: int, default=None) -> tuple[int, ...]:
    """A pooling argument as one int per spatial dim (torch allows one value for all, or none)."""
    values = tuple(values) if values is not None else ()
    if not values:
        values = tuple(default) if default is not None else (0,) * nd
    return values * nd if len(values) == 1 else values


def _out_size(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """Note [Pooling windows]."""
    out = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _window_pads(shape, k, s, p, d, ceil_mode) -> list[tuple[int, int]]:
    """(low, high) padding of each spatial dim so that VALID windows give torch's output."""
    pads = []
    for n, kk, ss, pp, dd in zip(shape, k, s, p, d):
        out = _out_size(n, kk, ss, pp, dd, ceil_mode)
        pads.append((pp, (out - 1) * ss + dd * (kk - 1) + 1 - n - pp))
    return pads


def _pad(x, pads, value):
    """Pad (or crop, for negative amounts) the trailing dims of ``x`` with ``value``."""
    lead = [(0, 0, 0)] * (x.ndim - len(pads))
    return jax.lax.pad(x, _dtypes.number(value, x.dtype), lead + [(lo, hi, 0) for lo, hi in pads])


def _window(x, nd: int, k, s, d):
    """reduce_window's window arguments over the trailing ``nd`` dims of ``x``."""
    lead = (1,) * (x.ndim - nd)
    return dict(
        window_dimensions=lead + tuple(k),
        window_strides=lead + tuple(s),
        padding=((0, 0),) * x.ndim,
        window_dilation=lead + tuple(d),
    )


# -- max pooling ---------------------------------------------------------------


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _pick_max(a, b):
    """The winning (value, index) pair of two (Note [Max pool indices])."""
    (va, ia), (vb, ib) = a, b
    first = ia < ib
    if jnp.issubdtype(va.dtype, jnp.floating):
        a_nan, b_nan = jnp.isnan(va), jnp.isnan(vb)
        take_a = jnp.where(a_nan | b_nan, a_nan & (~b_nan | first), (va > vb) | ((va == vb) & first))
    else:
        take_a = (va > vb) | ((va == vb) & first)
    return jnp.where(take_a, va, vb), jnp.where(take_a, ia, ib)


def _max_pool(x, nd: int, kernel_size, stride, padding, dilation, ceil_mode):
    k = _params(kernel_size, nd)
    s, p, d = _params(stride, nd, k), _params(padding, nd), _params(dilation, nd, (1,))
    spatial = x.shape[-nd:]
    plane = np.arange(math.prod(spatial), dtype=np.int64).reshape(spatial)
    index = jnp.broadcast_to(jnp.asarray(plane), x.shape)
    pads = _window_pads(spatial, k, s, p, d, ceil_mode)
    sentinel = np.iinfo(np.int64).max  # padding never wins a tie
    return jax.lax.reduce_window(
        (_pad(x, pads, _lowest(x.dtype)), _pad(index, pads, sentinel)),
        (jnp.asarray(_lowest(x.dtype), x.dtype), jnp.asarray(sentinel, jnp.int64)),
        _pick_max,
        **_window(x, nd, k, s, d),
    )


@lowering(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 2, kernel_size, stride, padding, dilation, ceil_mode)


@lowering(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    return _max_pool(x, 3, kernel_size, stride, padding, dilation, ceil_mode)


def _scatter_to_plane(grad, x, indices, nd: int):
    """Sum ``grad`` into zeros shaped like ``x`` at the flat spatial ``indices`` (Note [Max pool indices])."""
    plane = math.prod(x.shape[-nd:])
    rows = math.prod(x.shape[:-nd])
    per_row = math.prod(grad.shape[x.ndim - nd :])
    g = upcast(grad).reshape(rows, per_row)
    out = jnp.zeros((rows, plane), g.dtype).at[jnp.arange(rows)[:, None], indices.reshape(rows, per_row)].add(g)
    return out.reshape(x.shape)


@lowering(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_plane(grad_output, x, indices, 2)


@lowering(aten.max_pool3d_with_indices_backward.default)
def max_pool3d_with_indices_backward(grad_output, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    return _scatter_to_plane(grad_output, x, indices, 3)


# -- average pooling -----------------------------------------------------------


def _avg_pool(x, nd: int, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    k = _params(kernel_size, nd)
    s, p, d = _params(stride, nd, k), _params(padding, nd), (1,) * nd
    spatial = x.shape[-nd:]
    pads = _window_pads(spatial, k, s, p, d, ceil_mode)
    window = _window(x, nd, k, s, d)
    xf = upcast(x)
    total = jax.lax.reduce_window(_pad(xf, pads, 0), 0.0, jax.lax.add, **window)  # a Python 0: differentiable
    if divisor_override is not None:
        return total / divisor_override
    # Divisor per window: the positions it covers inside the input, or inside the
    # padded input when count_include_pad (never the ceil_mode overhang).
    if count_include_pad:
        ones = jnp.ones(tuple(n + 2 * pp for n, pp in zip(spatial, p)), xf.dtype)
        ones = _pad(ones, [(0, hi - pp) for (_, hi), pp in zip(pads, p)], 0)
    else:
        ones = _pad(jnp.ones(spatial, xf.dtype), pads, 0)
    counts = jax.lax.reduce_window(ones, 0.0, jax.lax.add, **_window(ones, nd, k, s, d))
    return total / counts


@lowering(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


@lowering(aten.avg_pool3d.default)
def avg_pool3d(x, kernel_size, stride=(), padding=(0,), ceil_mode=False, count_include_pad=True, divisor_override=None):
    return _avg_pool(x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)


def _avg_pool_backward(grad_output, x, nd, *attrs):
    _, vjp = jax.vjp(lambda a: _avg_pool(a, nd, *attrs), upcast(x))
    return vjp(upcast(grad_output))[0]


@lowering(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(
        grad_output, x, 2, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


@lowering(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad_output, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    return _avg_pool_backward(
        grad_output, x, 3, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override
    )


# -- adaptive average pooling --------------------------------------------------


def _adaptive_matrix(n: int, m: int) -> np.ndarray:
    """(m, n) 0/1 matrix: output i averages inputs floor(i*n/m) .. ceil((i+1)*n/m)."""
    i = np.arange(m)
    start, end = (i * n) // m, -((-(i + 1) * n) // m)
    j = np.arange(n)
    return ((j >= start[:, None]) & (j < end[:, None])).astype(np.float32)


def _adaptive_avg_pool(x, output_size):
    nd = len(output_size)
    out = upcast(x)
    for axis, m in zip(range(x.ndim - nd, x.ndim), output_size):
        n = out.shape[axis]
        if n % m == 0:  # uniform windows
            shape = out.shape[:axis] + (m, n // m) + out.shape[axis + 1 :]
            out = jnp.mean(out.reshape(shape), axis=axis + 1)
            continue
        weights = _adaptive_matrix(n, m)
        summed = jnp.tensordot(
            out, jnp.asarray(weights, out.dtype), axes=([axis], [1]), precision=jax.lax.Precision.HIGHEST
        )
        out = jnp.moveaxis(summed, -1, axis) / jnp.asarray(weights.sum(1), out.dtype).reshape(
            (m,) + (1,) * (out.ndim - axis - 1)
        )
    return out


@lowering(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool(x, output_size):
    if len(output_size) == 3 and x.dtype in (jnp.float16, jnp.bfloat16) and x.size and min(output_size) > 0:
        return _adaptive_avg_pool3d_half(x, tuple(output_size))
    return _adaptive_avg_pool(x, tuple(output_size))


def _adaptive_avg_pool3d_half(x, output_size):
    """torch's CPU ``adaptive_avg_pool3d_out_frame`` in a half dtype: the window
    is summed element by element in that dtype (t, then h, then w), then
    divided by ``kT``, ``kH`` and ``kW`` in turn, each step rounded."""
    windows, counts = x, []
    for i, m in enumerate(output_size):
        axis = x.ndim - 3 + 2 * i  # the axes before it were split in two
        taps, inside = _adaptive_taps(windows.shape[axis], m)
        windows = jnp.take(windows, jnp.asarray(taps.reshape(-1)), axis=axis)
        windows = windows.reshape(windows.shape[:axis] + taps.shape + windows.shape[axis + 1 :])
        mask = jnp.asarray(inside).reshape(taps.shape + (1,) * (windows.ndim - axis - 2))
        windows = jnp.where(mask, windows, jnp.zeros((), x.dtype))
        counts.append(inside.sum(1))
    lead = x.ndim - 3  # windows: batch + (mT, KT, mH, KH, mW, KW) -> (KT * KH * KW, batch + (mT, mH, mW))
    order = (lead + 1, lead + 3, lead + 5, *range(lead), lead, lead + 2, lead + 4)
    taps = jnp.transpose(windows, order).reshape((-1,) + x.shape[:lead] + tuple(output_size))

    def add(acc, v):
        return (acc.astype(jnp.float32) + v.astype(jnp.float32)).astype(x.dtype), None

    total, _ = lax.scan(add, jnp.zeros(taps.shape[1:], x.dtype), taps)
    kt, kh, kw = (np.asarray(c, np.float32) for c in counts)
    out = total
    for k, shape in ((kt, (-1, 1, 1)), (kh, (-1, 1)), (kw, (-1,))):
        out = lax.optimization_barrier((out.astype(jnp.float32) / jnp.asarray(k.reshape(shape))).astype(x.dtype))
    return out


def _adaptive_avg_pool_backward(grad_output, x, nd: int):
    _, vjp = jax.vjp(lambda a: _adaptive_avg_pool(a, grad_output.shape[-nd:]), upcast(x))
    return vjp(upcast(grad_output))[0]


@lowering(aten._adaptive_avg_pool2d_backward.default)
def adaptive_avg_pool2d_backward(grad_output, x):
    return _adaptive_avg_pool_backward(grad_output, x, 2)


@lowering(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad_output, x):
    return _adaptive_avg_pool_backward(grad_output, x, 3)


# -- adaptive max pooling ------------------------------------------------------


def _adaptive_taps(n: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(m, K) input positions of each output's window (``_adaptive_matrix``'s
    bounds; K the widest window) and which of them are inside the window.
    Taps past a window's end repeat a position; they are masked out."""
    i = np.arange(m)
    start, end = (i * n) // m, -((-(i + 1) * n) // m)
    width = int((end - start).max())
    taps = start[:, None] + np.arange(width)
    return np.minimum(taps, n - 1), taps < end[:, None]


def _plane_taps(taps, sizes, xp=np):
    """Flat plane positions of every window tap: ``taps[d]`` is ``batch +
    (m_d, k_d)`` positions along dim ``d`` (of size ``sizes[d]``); the result
    is ``batch + (m_1, .., m_nd, k_1 * .. * k_nd)``."""
    nd = len(taps)
    strides = [math.prod(sizes[d + 1 :]) for d in range(nd)]
    flat = 0
    for d, t in enumerate(taps):
        batch, (m, k) = t.shape[:-2], t.shape[-2:]
        shape = batch + (1,) * d + (m,) + (1,) * (nd - d - 1) + (1,) * d + (k,) + (1,) * (nd - d - 1)
        flat = flat + xp.reshape(t, shape) * strides[d]
    return xp.reshape(flat, flat.shape[: flat.ndim - nd] + (math.prod(flat.shape[flat.ndim - nd :]),))


def _first_max(values, taps):
    """Max over the last axis and its tap, in torch's CPU scan order: the
    first maximum wins, a NaN wins over anything and the last NaN over an
    earlier one (Note [Max pool indices])."""
    if jnp.issubdtype(values.dtype, jnp.floating):
        nan = jnp.isnan(values)
        last_nan = values.shape[-1] - 1 - jnp.argmax(nan[..., ::-1], axis=-1)
        pick = jnp.where(jnp.any(nan, axis=-1), last_nan, jnp.argmax(jnp.where(nan, 0, values), axis=-1))
    else:
        pick = jnp.argmax(values, axis=-1)
    out = jnp.take_along_axis(values, pick[..., None], axis=-1)[..., 0]
    index = jnp.take_along_axis(jnp.broadcast_to(taps, values.shape), pick[..., None], axis=-1)[..., 0]
    return out, index


def _adaptive_max_pool(x, output_size):
    nd = len(output_size)
    spatial = x.shape[-nd:]
    pairs = [_adaptive_taps(n, m) for n, m in zip(spatial, output_size)]
    flat = _plane_taps([t for t, _ in pairs], spatial)
    valid = _plane_taps([inside.astype(np.int64) for _, inside in pairs], (1,) * nd) == nd
    values = x.reshape(x.shape[:-nd] + (-1,))[..., flat]  # batch + output + (K,)
    values = jnp.where(valid, values, jnp.asarray(_lowest(x.dtype), x.dtype))
    return _first_max(values, jnp.asarray(flat))


@lowering(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(x, output_size):
    return _adaptive_max_pool(x, tuple(output_size))


@lowering(aten.adaptive_max_pool2d_backward.default)
def adaptive_max_pool2d_backward(grad_output, x, indices):
    return _scatter_to_plane(grad_output, x, indices, 2)


@lowering(aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool3d_backward(grad_output, x, indices):
    return _scatter_to_plane(grad_output, x, indices, 3)


# -- fractional max pooling ------------------------------------------------------


def _fractional_starts(sample, n: int, m: int, k: int):
    """Window starts along a dim (torch's ``generate_intervals``): ``int((i +
    u) * a) - int(u * a)`` for ``a = (n - k) / (m - 1)``, computed in the
    sample's dtype, and ``n - k`` for the last window."""
    dtype = sample.dtype
    if m == 1:
        return jnp.full(sample.shape + (1,), n - k, jnp.int64)
    alpha = jnp.asarray(n - k, dtype) / jnp.asarray(m - 1, dtype)
    i = jnp.arange(m - 1).astype(dtype)
    u = sample[..., None]
    starts = ((i + u) * alpha).astype(jnp.int64) - (u * alpha).astype(jnp.int64)
    return jnp.concatenate([starts, jnp.full(sample.shape + (1,), n - k, jnp.int64)], axis=-1)


def _fractional_max_pool(x, kernel_size, output_size, samples, order):
    """Max over windows of ``kernel_size`` at pseudo-random starts drawn from
    ``samples`` (batch, channel, nd), whose last axis lists the dims in
    ``order`` (torch's kernels: W then H in 2-d; T, H, W in 3-d)."""
    nd = len(output_size)
    unbatched = x.ndim == nd + 1
    if unbatched:
        x = x[None]
    samples = samples[: x.shape[0]]  # for a larger batch, CPU's kernels read its first rows
    spatial = x.shape[-nd:]
    taps = []
    for d in range(nd):
        u = samples[..., order.index(d)]
        starts = _fractional_starts(u, spatial[d], output_size[d], kernel_size[d])
        taps.append(starts[..., None] + jnp.arange(max(kernel_size[d], 1)))
    flat = _plane_taps(taps, spatial, jnp)  # (N, C) + output + (K,)
    if 0 in kernel_size:  # CPU's empty windows: -inf, at each window's start
        out, index = jnp.full(flat.shape[:-1], -jnp.inf, x.dtype), flat[..., 0]
        return (out[0], index[0]) if unbatched else (out, index)
    plane = x.reshape(x.shape[:2] + (math.prod(spatial),))
    taps = flat.reshape(flat.shape[:2] + (math.prod(flat.shape[2:]),))
    values = jnp.take_along_axis(plane, taps, axis=-1).reshape(flat.shape)
    out, index = _first_max(values, flat)
    return (out[0], index[0]) if unbatched else (out, index)


@lowering(aten.fractional_max_pool2d.default)
def fractional_max_pool2d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, _params(kernel_size, 2), _params(output_size, 2), random_samples, (1, 0))


@lowering(aten.fractional_max_pool3d.default)
def fractional_max_pool3d(x, kernel_size, output_size, random_samples):
    return _fractional_max_pool(x, _params(kernel_size, 3), _params(output_size, 3), random_samples, (0, 1, 2))


@lowering(aten.fractional_max_pool2d_backward.default)
def fractional_max_pool2d_backward(grad_output, x, kernel_size, output_size, indices):
    return _scatter_to_plane(grad_output, x, indices, 2)


@lowering(aten.fractional_max_pool3d_backward.default)
def fractional_max_pool3d_backward(grad_output, x, kernel_size, output_size, indices):
    return _scatter_to_plane(grad_output, x, indices, 3)
