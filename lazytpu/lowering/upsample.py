"""Spatial resampling: upsample (nearest, linear, cubic, antialiased),
reflection/replication padding, pixel and channel shuffles; with backward.

Note [Resampling taps]: every upsample mode is separable: along each spatial
dim, output position ``o`` reads input positions ``index[o, k]`` with weights
``weight[o, k]``. Sizes and scales are static, so the tables are computed
with numpy while tracing, with torch's CPU formulas in torch's arithmetic
(float32 positions for nearest; the op's compute dtype for the others), and
the rule is a few gathers and a weighted sum per dim: exact for nearest, and
NaN/inf propagate as in torch (no dense interpolation matrix).

Note [uint8 resampling]: CPU torch resamples a uint8 image (bilinear,
bicubic, and both antialiased) the way Pillow does, not by the float
formulas: one dim at a time (the last first, a dim of unchanged size
skipped), each pass in integers with weights rounded to int16 at a
per-dim precision ``p`` (the largest that keeps the largest weight under
2**15), ``(2**(p-1) + sum(pixel * weight)) >> p`` clamped to 0..255 and
stored as uint8 before the next pass. Without antialiasing, the taps are
``interp_size`` wide with the weights of out-of-range taps folded onto the
edge pixel, and bicubic uses a = -0.75 (a = -0.5 when antialiased).
``_uint8_taps`` builds those tables in float64 as torch does and
``_resample_uint8`` applies them, so the results are CPU's to the bit.

Note [Backward by VJP]: an op's ``*_backward`` is the JAX VJP of the forward
rule at a zero input of ``input_size``: the forward is linear in its input,
so the VJP is exact and needs no second formula.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


# -- tap tables (Note [Resampling taps]) ---------------------------------------


def _compute_dtype(x):
    return np.float64 if x.dtype == jnp.float64 else np.float32


def _scale(in_size: int, out_size: int, align_corners: bool, scale, dtype):
    """torch's ``area_pixel_compute_scale``."""
    if align_corners:
        return dtype((in_size - 1) / (out_size - 1)) if out_size > 1 else dtype(0)
    if scale is not None and scale > 0:
        return dtype(1.0 / scale)
    return dtype(in_size) / dtype(out_size)


def _nearest_taps(in_size: int, out_size: int, scale, exact: bool):
    dst = np.arange(out_size, dtype=np.float32)
    if out_size == in_size:
        index = np.arange(out_size)
    elif out_size == 2 * in_size and not exact:
        index = np.arange(out_size) >> 1
    else:
        s = _scale(in_size, out_size, False, scale, np.float32)
        index = np.floor(((dst + np.float32(0.5)) if exact else dst) * s).astype(np.int64)
        index = np.minimum(index, in_size - 1)
    return index[:, None], None


def _source_position(in_size, out_size, align_corners, scale, dtype, *, cubic: bool):
    """torch's ``area_pixel_compute_source_index`` for every output position."""
    s = _scale(in_size, out_size, align_corners, scale, dtype)
    dst = np.arange(out_size, dtype=dtype)
    if align_corners:
        return s * dst
    src = s * (dst + dtype(0.5)) - dtype(0.5)
    return src if cubic else np.maximum(src, dtype(0))


def _linear_taps(in_size, out_size, align_corners, scale, dtype):
    src = _source_position(in_size, out_size, align_corners, scale, dtype, cubic=False)
    i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    lam = np.clip(src - i0.astype(dtype), 0, 1).astype(dtype)
    i1 = i0 + (i0 < in_size - 1)
    return np.stack([i0, i1], 1), np.stack([1 - lam, lam], 1)


def _cubic(x, a):
    """Keys' cubic convolution kernel at distances ``x >= 0``."""
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return np.where(x < 1, near, np.where(x < 2, far, 0))


def _cubic_taps(in_size, out_size, align_corners, scale, dtype):
    src = _source_position(in_size, out_size, align_corners, scale, dtype, cubic=True)
    i0 = np.floor(src)
    t = (src - i0).astype(dtype)
    a = dtype(-0.75)
    weight = np.stack([_cubic(t + 1, a), _cubic(t, a), _cubic(1 - t, a), _cubic(2 - t, a)], 1).astype(dtype)
    index = np.clip(i0.astype(np.int64)[:, None] + np.arange(-1, 3), 0, in_size - 1)
    return index, weight


def _antialias_taps(in_size, out_size, align_corners, scale, dtype, *, cubic: bool):
    """torch's ``_upsample_*2d_aa`` (PIL's filters): a triangle or Keys' cubic
    (``a = -0.5``), widened by the downsampling factor."""
    s = float(_scale(in_size, out_size, align_corners, scale, np.float64))
    width = 4 if cubic else 2
    support = width * 0.5 * s if s >= 1.0 else width * 0.5
    invscale = 1.0 / s if s >= 1.0 else 1.0
    taps = int(np.ceil(support)) * 2 + 1
    index = np.zeros((out_size, taps), np.int64)
    weight = np.zeros((out_size, taps), np.float64)
    for o in range(out_size):
        center = s * (o + 0.5)
        lo = max(int(center - support + 0.5), 0)
        size = min(max(min(int(center + support + 0.5), in_size) - lo, 0), taps)  # torch clips it too
        x = np.abs((np.arange(size) + lo - center + 0.5) * invscale)
        w = _cubic(x, -0.5) if cubic else np.where(x < 1, 1 - x, 0)
        total = w.sum()
        index[o, :size] = np.arange(lo, lo + size)
        weight[o, :size] = w / total if total != 0 else w
    return index, weight.astype(dtype)


def _guarded_taps(in_size, out_size, align_corners, scale, *, cubic: bool):
    """The taps of CPU torch's uint8 path without antialiasing
    (``_compute_indices_min_size_weights``): ``interp_size`` input positions
    around the source index, the weights of positions past either edge added
    to the edge's; float64, as torch computes them. Returns the tables and
    the largest weight (running, as torch tracks it)."""
    support = 2 if cubic else 1
    taps = 2 * support
    s = float(_scale(in_size, out_size, align_corners, scale, np.float64))
    index = np.zeros((out_size, taps), np.int64)
    weight = np.zeros((out_size, taps), np.float64)
    largest = 0.0
    for o in range(out_size):
        real = s * o if align_corners else s * (o + 0.5) - 0.5
        if not (align_corners or cubic):
            real = max(real, 0.0)
        base = min(int(np.floor(np.float32(real))), in_size - 1)  # torch's floorf of a double
        lam = min(max(real - base, 0.0), 1.0)
        low = base - support + 1
        start = max(low, 0)
        size = min(max(min(base + support + 1, in_size) - start, 0), taps)
        slot = 0
        for j in range(taps):
            x = abs(j + 1 - support - lam)
            w = float(_cubic(x, -0.75)) if cubic else (1.0 - x if x < 1.0 else 0.0)
            if low + j <= 0:
                slot = 0
            elif low + j >= in_size - 1:
                slot = size - 1
            weight[o, slot] += w
            largest = max(largest, weight[o, slot])
            slot += 1
        index[o, :size] = np.arange(start, start + size)
    return index, weight, largest


def _uint8_taps(in_size, out_size, align_corners, scale, mode: str):
    """See Note [uint8 resampling]: ``(index, int16 weights as int32, precision)``."""
    if mode in ("linear_aa", "cubic_aa"):
        index, weight = _antialias_taps(in_size, out_size, align_corners, scale, np.float64, cubic=mode == "cubic_aa")
        largest = max(float(weight.max()), 0.0)
    else:
        index, weight, largest = _guarded_taps(in_size, out_size, align_corners, scale, cubic=mode == "cubic")
    precision = next((p for p in range(22) if int(0.5 + largest * (1 << (p + 1))) >= 1 << 15), 22)
    scaled = weight * (1 << precision)
    rounded = np.trunc(np.where(scaled < 0, scaled - 0.5, scaled + 0.5)).astype(np.int32)
    return index, rounded, precision


def _resample_uint8(x, output_size, scales, mode: str, align_corners: bool):
    """See Note [uint8 resampling]: one integer pass per resized dim, last dim first."""
    n = len(output_size)
    for dim in reversed(range(n)):
        axis = x.ndim - n + dim
        in_size, out_size = x.shape[axis], output_size[dim]
        if in_size == out_size:
            continue
        index, weight, precision = _uint8_taps(in_size, out_size, align_corners, _spatial_scales(scales, n)[dim], mode)
        shape = [1] * x.ndim
        shape[axis] = out_size
        wide = x.astype(jnp.int32)
        total = jnp.full((), 1 << (precision - 1), jnp.int32)
        for k in range(index.shape[1]):
            tap = jnp.take(wide, jnp.asarray(index[:, k]), axis=axis)
            total = total + tap * jnp.asarray(weight[:, k]).reshape(shape)
        x = jnp.clip(total >> precision, 0, 255).astype(jnp.uint8)
    return x


def _resample(x, tables):
    """Apply one ``(index, weight)`` table per trailing spatial dim."""
    first = x.ndim - len(tables)
    for axis, (index, weight) in enumerate(tables, first):
        if weight is None:
            x = jnp.take(x, jnp.asarray(index[:, 0]), axis=axis)
            continue
        shape = [1] * x.ndim
        shape[axis] = index.shape[0]
        out = None
        for k in range(index.shape[1]):
            term = jnp.take(x, jnp.asarray(index[:, k]), axis=axis) * jnp.asarray(weight[:, k], x.dtype).reshape(shape)
            out = term if out is None else out + term
        x = out
    return x


def _spatial_scales(scales, n: int):
    return list(scales) if scales else [None] * n


def _upsample(x, output_size, scales, mode: str, align_corners: bool = False):
    if x.dtype == jnp.uint8 and mode not in ("nearest", "nearest-exact"):
        return _resample_uint8(x, output_size, scales, mode, align_corners)
    n = len(output_size)
    ins = x.shape[-n:]
    dtype = _compute_dtype(x)
    tables = []
    for in_size, out_size, scale in zip(ins, output_size, _spatial_scales(scales, n)):
        if mode in ("nearest", "nearest-exact"):
            tables.append(_nearest_taps(in_size, out_size, scale, mode == "nearest-exact"))
        elif mode == "linear":
            tables.append(_linear_taps(in_size, out_size, align_corners, scale, dtype))
        elif mode == "cubic":
            tables.append(_cubic_taps(in_size, out_size, align_corners, scale, dtype))
        else:
            tables.append(_antialias_taps(in_size, out_size, align_corners, scale, dtype, cubic=mode == "cubic_aa"))
    upcast = x.dtype in (jnp.float16, jnp.bfloat16) and mode not in ("nearest", "nearest-exact")
    out = _resample(x.astype(jnp.float32) if upcast else x, tables)
    return out.astype(x.dtype)


def _vjp(forward, grad, input_size):
    """Note [Backward by VJP]."""
    _, pullback = jax.vjp(forward, jnp.zeros(tuple(input_size), grad.dtype))
    return pullback(grad)[0]


# -- upsample ------------------------------------------------------------------


def _nearest_rule(exact: bool):
    mode = "nearest-exact" if exact else "nearest"

    def forward(x, output_size, *scales):
        return _upsample(x, output_size, scales, mode)

    def backward(grad, output_size, input_size, *scales):
        return _vjp(lambda x: _upsample(x, output_size, scales, mode), grad, input_size)

    return forward, backward


def _interp_rule(mode: str):
    def forward(x, output_size, align_corners, *scales):
        return _upsample(x, output_size, scales, mode, align_corners)

    def backward(grad, output_size, input_size, align_corners, *scales):
        return _vjp(lambda x: _upsample(x, output_size, scales, mode, align_corners), grad, input_size)

    return forward, backward


_NEAREST = {
    False: (aten.upsample_nearest1d, aten.upsample_nearest2d, aten.upsample_nearest3d),
    True: (aten._upsample_nearest_exact1d, aten._upsample_nearest_exact2d, aten._upsample_nearest_exact3d),
}
for _exact, _packets in _NEAREST.items():
    _fwd, _bwd = _nearest_rule(_exact)
    lowering(*(p.default for p in _packets))(_fwd)
    lowering(*(getattr(aten, f"{p._qualified_op_name.split('::')[1]}_backward").default for p in _packets))(_bwd)

_INTERPOLATING = {
    "linear": (aten.upsample_linear1d, aten.upsample_bilinear2d, aten.upsample_trilinear3d),
    "cubic": (aten.upsample_bicubic2d,),
    "linear_aa": (aten._upsample_bilinear2d_aa,),
    "cubic_aa": (aten._upsample_bicubic2d_aa,),
}
for _mode, _packets in _INTERPOLATING.items():
    _fwd, _bwd = _interp_rule(_mode)
    lowering(*(p.default for p in _packets))(_fwd)
    lowering(*(getattr(aten, f"{p._qualified_op_name.split('::')[1]}_backward").default for p in _packets))(_bwd)


# -- padding -------------------------------------------------------------------


def _pad(x, padding, mode: str):
    """torch's ``padding`` (last dim first, ``(left, right)`` pairs; negative
    values crop) as a gather per dim: output ``j`` reads input ``j - left``
    clamped (``"edge"``) or reflected (``"reflect"``) into range."""
    n = len(padding) // 2
    for i in range(n):
        axis = x.ndim - 1 - i
        lo, hi = padding[2 * i], padding[2 * i + 1]
        size = x.shape[axis]
        index = np.arange(size + lo + hi) - lo
        if mode == "edge":
            index = np.clip(index, 0, size - 1)
        else:
            index = (size - 1) - np.abs((size - 1) - np.abs(index))
        x = jnp.take(x, jnp.asarray(index), axis=axis)
    return x


def _pad_rule(mode: str):
    def forward(x, padding):
        return _pad(x, padding, mode)

    def backward(grad, x, padding):
        return _vjp(lambda v: _pad(v, padding, mode), grad, x.shape)

    return forward, backward


for _mode, _name in (("reflect", "reflection"), ("edge", "replication")):
    _fwd, _bwd = _pad_rule(_mode)
    lowering(*(getattr(aten, f"{_name}_pad{d}d").default for d in (1, 2, 3)))(_fwd)
    lowering(*(getattr(aten, f"{_name}_pad{d}d_backward").default for d in (1, 2, 3)))(_bwd)


# -- shuffles ------------------------------------------------------------------


@lowering(aten.pixel_shuffle.default)
def pixel_shuffle(x, upscale_factor):
    r = upscale_factor
    *batch, c, h, w = x.shape
    y = x.reshape(*batch, c // (r * r), r, r, h, w)
    n = len(batch)
    y = jnp.transpose(y, (*range(n), n, n + 3, n + 1, n + 4, n + 2))
    return y.reshape(*batch, c // (r * r), h * r, w * r)


@lowering(aten.pixel_unshuffle.default)
def pixel_unshuffle(x, downscale_factor):
    r = downscale_factor
    *batch, c, h, w = x.shape
    y = x.reshape(*batch, c, h // r, r, w // r, r)
    n = len(batch)
    y = jnp.transpose(y, (*range(n), n, n + 2, n + 4, n + 1, n + 3))
    return y.reshape(*batch, c * r * r, h // r, w // r)


@lowering(aten.channel_shuffle.default, aten.native_channel_shuffle.default)
def channel_shuffle(x, groups):
    b, c = x.shape[:2]
    rest = x.shape[2:]
    return jnp.swapaxes(x.reshape(b, groups, c // groups, *rest), 1, 2).reshape(x.shape)


# -- grid sampling -------------------------------------------------------------
# Note [Grid sampling]: ``grid[..., k]`` holds normalized coordinates in
# [-1, 1] of the input's k-th spatial dim counted from the last (x is width).
# Modes: 0 bilinear, 1 nearest (round half to even), 2 bicubic; padding: 0
# zeros, 1 border, 2 reflection; torch's GridSampler.h formulas.


def _unnormalize(coord, size: int, align_corners: bool):
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord, twice_low: int, twice_high: int):
    if twice_low == twice_high:
        return jnp.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    coord = jnp.abs(coord - low)
    extra = jnp.fmod(coord, span)
    flips = jnp.floor(coord / span)
    return jnp.where(jnp.fmod(flips, 2) == 0, extra + low, span - extra + low)


def _pad_coordinate(coord, size: int, padding: int, align_corners: bool):
    if padding == 2:
        twice = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        coord = _reflect(coord, *twice)
    if padding in (1, 2):
        coord = jnp.clip(coord, 0, size - 1)
    return coord


def _gather(x, indices, sizes, padding: int):
    """``x[n, :, *indices]`` per batch ``n`` (``indices`` shaped like the
    output), zero where an index falls outside and padding is zeros."""
    inside = jnp.ones(indices[0].shape, bool)
    clamped = []
    for index, size in zip(indices, sizes):
        inside &= (index >= 0) & (index <= size - 1)
        clamped.append(jnp.clip(index, 0, size - 1).astype(jnp.int32))
    values = jax.vmap(lambda xb, *ib: xb[(slice(None), *ib)])(x, *clamped)  # (N, C, *out)
    return jnp.where(inside[:, None], values, 0) if padding == 0 else values


def _grid_sample(x, grid, mode: int, padding: int, align_corners: bool):
    sizes = x.shape[2:]
    n = len(sizes)
    coords = [_unnormalize(grid[..., n - 1 - d], sizes[d], align_corners) for d in range(n)]
    if mode == 2:
        return _grid_sample_bicubic(x, coords, sizes, padding, align_corners)
    coords = [_pad_coordinate(c, s, padding, align_corners) for c, s in zip(coords, sizes)]
    if mode == 1:
        return _gather(x, [jnp.round(c) for c in coords], sizes, padding)
    lows = [jnp.floor(c) for c in coords]
    out = 0
    for corner in range(2**n):
        index, weight = [], 1
        for d in range(n):
            high = (corner >> d) & 1
            index.append(lows[d] + high)
            weight = weight * (coords[d] - lows[d] if high else lows[d] + 1 - coords[d])
        out = out + _gather(x, index, sizes, padding) * weight[:, None].astype(x.dtype)
    return out


def _grid_sample_bicubic(x, coords, sizes, padding: int, align_corners: bool):
    (cy, cx), (h, w) = coords, sizes
    y0, x0 = jnp.floor(cy), jnp.floor(cx)
    ty, tx = cy - y0, cx - x0

    def coefficients(t):
        a = -0.75
        near = lambda v: ((a + 2) * v - (a + 3)) * v * v + 1  # noqa: E731
        far = lambda v: ((a * v - 5 * a) * v + 8 * a) * v - 4 * a  # noqa: E731
        return (far(t + 1), near(t), near(1 - t), far(2 - t))

    wy, wx = coefficients(ty), coefficients(tx)
    out = 0
    for i in range(4):
        iy = _pad_coordinate(y0 - 1 + i, h, padding, align_corners)
        for j in range(4):
            ix = _pad_coordinate(x0 - 1 + j, w, padding, align_corners)
            out = out + _gather(x, [iy, ix], sizes, padding) * (wy[i] * wx[j])[:, None].astype(x.dtype)
    return out


@lowering(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def grid_sampler(x, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample(x, grid, interpolation_mode, padding_mode, align_corners)


@lowering(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def grid_sampler_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners, output_mask):
    _, pullback = jax.vjp(lambda v, g: _grid_sample(v, g, interpolation_mode, padding_mode, align_corners), x, grid)
    return pullback(grad)
