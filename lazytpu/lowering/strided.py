"""Strided views over a storage, as pure JAX (Note [Views as strides]).

Note [Views as strides]: a tensor on ``tpu`` is a (size, stride, offset)
window on a storage, exactly as in torch. The storage holds one logical
array (its base layout: shape and strides). Reading a window that is not the
base layout is ``view_read``; writing through it is ``view_write``, which
returns the new base value. Both work on the storage's physical (flat) order,
gaps included where the base's strides leave them (``empty_strided``, an
output whose meta kernel pads it): windows are offsets into that memory.

A window whose strides nest (each stride a multiple of the next, rows not
overlapping) is taken with pad + reshape + slice + transpose, which XLA turns
into cheap copies; any other window (overlapping ``unfold``/``as_strided``)
is a gather with constant indices.

Note [Box windows]: most windows of a dense base (no gaps) are boxes of
its logical array: each of their dims runs along a distinct base dim with
that dim's stride (``x[:, :, k]``, ``x[2:5]``, ``x.t()``, ``cache[:, pos]``).
Such a window is read with one ``dynamic_slice`` of the base and written with
one ``dynamic_update_slice``, at the digits of its offset in the base's
strides: XLA updates the buffer in place and compiles a few instructions,
where the flat path above copies the whole storage through a pad and a
reshape for every write (a loop writing one column per step of a
(8, 64, 4096) buffer ran 30 times slower, and an op chain of such writes
compiled twice as long). Whether a window is a box depends on its offset
(``x.view(-1)[20:24]`` of a (2, 23) base runs past a row's end), which a
lifted offset (Note [Window offsets] in lazytpu.frontend.windows) does not
show the program; so the recording decides it (``fits_box``) and passes
``box=True``, part of the program's key: offsets that make boxes share a
program, one that does not takes the flat path.

Note [Dtype views]: a view with another dtype than its storage
(``view_as_real``, ``.real``/``.imag``, ``view_as_complex``, ``view(dtype)``)
is a window in units of its own dtype on the storage's bytes: reading it
reinterprets the storage's flat array as that dtype first (a complex number is
its two parts, other dtypes are bitcast), writing reinterprets back after.
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from lazytpu import _dtypes
from lazytpu.lowering.registry import lowering

VIEW_READ = "lazytpu.view_read"
VIEW_WRITE = "lazytpu.view_write"


def _physical_order(shape, strides) -> list[int]:
    """Dims from outermost to innermost in memory."""
    return sorted(range(len(shape)), key=lambda d: (-strides[d], d))


def _gaps(shape, strides) -> bool:
    """Whether a base laid out with ``strides`` leaves gaps in memory
    (``empty_strided((2, 3), (7, 1))``, an output a meta kernel pads):
    its memory is then as long as its reach, not its size."""
    return 0 not in shape and _reach(shape, strides) > math.prod(shape) and not overlaps_itself(shape, strides)


def to_flat(x, strides):
    """The physical (memory-order) 1-D array of an array ``x`` laid out with
    ``strides``; the gaps of a layout with gaps (Note [Views as strides]) hold zeros."""
    if x.ndim == 0:
        return x.reshape(1)
    if _gaps(x.shape, tuple(strides)):
        indices = _gather_indices(x.shape, strides, 0).reshape(-1)
        return jnp.zeros(_reach(x.shape, strides), x.dtype).at[indices].set(x.reshape(-1), unique_indices=True)
    order = _physical_order(x.shape, strides)
    if order != list(range(x.ndim)):
        x = jnp.transpose(x, order)
    return x.reshape(-1)


def from_flat(flat, shape, strides):
    """Inverse of ``to_flat``."""
    if len(shape) == 0:
        return flat.reshape(())
    if _gaps(tuple(shape), tuple(strides)):
        return flat[_gather_indices(shape, strides, 0)]
    order = _physical_order(shape, strides)
    x = flat.reshape(tuple(shape[d] for d in order))
    if order != list(range(len(shape))):
        x = jnp.transpose(x, np.argsort(order))
    return x


def _nested_plan(size, stride):
    """Plan a regular window: (dims by stride, extents of the reshaped grid).

    Returns None when the window overlaps itself or its strides don't nest.
    """
    dims = [d for d in range(len(size)) if size[d] > 1 and stride[d] != 0]
    dims.sort(key=lambda d: -stride[d])
    if not dims:
        return dims, []
    for a, b in zip(dims, dims[1:]):
        if stride[a] % stride[b] != 0 or stride[b] * size[b] > stride[a]:
            return None
    extents = [size[dims[0]]] + [stride[a] // stride[b] for a, b in zip(dims, dims[1:])] + [stride[dims[-1]]]
    return dims, extents


def _reach(size, stride) -> int:
    """How many elements from its offset a window's last element lies, plus one."""
    return 1 + sum((n - 1) * s for n, s in zip(size, stride))


def _padded(flat, offset, span: int, reach: int):
    """``flat`` padded so that ``span`` elements from ``offset`` exist. A
    lifted ``offset`` (a traced number, Note [Window offsets] in
    lazytpu.frontend.windows) is known only to keep the window's ``reach``
    inside ``flat``."""
    need = offset + span - flat.shape[0] if isinstance(offset, int) else span - reach
    return jnp.pad(flat, (0, need)) if need > 0 else flat


def _grid(flat, offset, extents, reach: int):
    """``flat[offset:]`` padded and reshaped to ``extents`` (an index grid)."""
    span = math.prod(extents)
    flat = _padded(flat, offset, span, reach)
    return lax.dynamic_slice(flat, (offset,), (span,)).reshape(extents)


def _gather_indices(size, stride, offset) -> np.ndarray:
    idx = np.full(tuple(size), offset, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        idx = idx + (np.arange(n, dtype=np.int64) * s).reshape(shape)
    return idx


@functools.lru_cache(maxsize=4096)
def overlaps_itself(size: tuple, stride: tuple) -> bool:
    """Whether two elements of the window ``(size, stride)`` share a location (``expand``, ``unfold``)."""
    if math.prod(size) <= 1:
        return False
    plan = _nested_plan(size, stride)
    if plan is not None and not any(stride[d] == 0 and size[d] > 1 for d in range(len(size))):
        return False
    idx = _gather_indices(size, stride, 0)
    return np.unique(idx).size < idx.size


def window(flat, size, stride, offset):
    """``torch.as_strided(flat, size, stride, offset)`` for a 1-D ``flat``."""
    size, stride = tuple(size), tuple(stride)
    if math.prod(size) == 0:
        return jnp.zeros(size, flat.dtype)
    plan = _nested_plan(size, stride)
    if plan is None:
        return flat[_gather_indices(size, stride, 0) + offset]
    dims, extents = plan
    if not dims:
        x = flat[offset]
        return jnp.broadcast_to(x, size)
    grid = _grid(flat, offset, extents, _reach(size, stride))
    x = grid[tuple(slice(0, size[d]) for d in dims) + (0,)]  # axes in stride order
    if len(dims) > 1:
        x = jnp.transpose(x, [dims.index(d) for d in sorted(dims)])
    x = x.reshape([size[d] if d in dims else 1 for d in range(len(size))])
    return jnp.broadcast_to(x, size)


def write_window(flat, value, size, stride, offset):
    """``flat`` with the window ``(size, stride, offset)`` set to ``value``."""
    size, stride = tuple(size), tuple(stride)
    if math.prod(size) == 0:
        return flat
    value = jnp.broadcast_to(value, size).astype(flat.dtype)
    plan = _nested_plan(size, stride)
    if plan is None or any(stride[d] == 0 and size[d] > 1 for d in range(len(size))):
        idx = _gather_indices(size, stride, 0).reshape(-1) + offset
        if not overlaps_itself(size, stride):
            return flat.at[idx].set(value.reshape(-1))
        # A window whose elements share memory (``expand``, overlapping ``unfold``): of the
        # elements sharing a location, the one the write changed wins (as torch writing in place).
        value, old = value.reshape(-1), flat[idx]
        same = value == old
        if jnp.issubdtype(old.dtype, jnp.inexact):
            same = same | (jnp.isnan(value) & jnp.isnan(old))
        return flat.at[jnp.where(same, flat.shape[0], idx)].set(value, mode="drop")
    dims, extents = plan
    if not dims:
        return flat.at[offset].set(value.reshape(-1)[0])
    n = flat.shape[0]
    span = math.prod(extents)
    padded = _padded(flat, offset, span, _reach(size, stride))
    grid = lax.dynamic_slice(padded, (offset,), (span,)).reshape(extents)
    ordered = jnp.transpose(
        value.reshape(tuple(size[d] for d in range(len(size)) if d in dims)), [sorted(dims).index(d) for d in dims]
    )
    index = tuple(slice(0, size[d]) for d in dims) + (0,)
    grid = grid.at[index].set(ordered)
    return lax.dynamic_update_slice(padded, grid.reshape(-1), (offset,))[:n]


@functools.lru_cache(maxsize=4096)
def _box_dims(base_shape: tuple, base_stride: tuple, size: tuple, stride: tuple):
    """For each dim of the window, the base dim it runs along (None for a dim
    of size 1), when the window is a box of a dense base (Note [Box windows]);
    else None."""
    inner = sorted((d for d in range(len(base_shape)) if base_shape[d] > 1), key=lambda d: base_stride[d])
    expected = 1
    for d in inner:
        if base_stride[d] != expected:
            return None  # gaps, overlaps or a stride of 0 in the base
        expected *= base_shape[d]
    dims, used = [], set()
    for n, s in zip(size, stride):
        if n == 1:
            dims.append(None)
            continue
        j = next((j for j in inner if base_stride[j] == s and j not in used), None)
        if j is None or n > base_shape[j]:
            return None
        used.add(j)
        dims.append(j)
    return tuple(dims)


def fits_box(base_shape, base_stride, size, stride, offset: int) -> bool:
    """Whether the window ``(size, stride, offset)`` of a base is a box of it
    (Note [Box windows]): each of its dims runs along a base dim, and at
    ``offset`` none of them runs past the base's edge."""
    if math.prod(size) == 0 or offset < 0 or offset + _reach(size, stride) > math.prod(base_shape):
        return False
    dims = _box_dims(tuple(base_shape), tuple(base_stride), tuple(size), tuple(stride))
    if dims is None:
        return False
    starts = _box_starts(base_shape, base_stride, offset)
    return all(j is None or starts[j] + n <= base_shape[j] for j, n in zip(dims, size))


def _box_starts(base_shape, base_stride, offset) -> list:
    """The box's first index along each base dim: the digits of ``offset``
    (a non-negative number, maybe traced) in the base's strides."""
    if isinstance(offset, int):
        return [(offset // s) % n if n > 1 else 0 for n, s in zip(base_shape, base_stride)]
    offset = offset.astype(np.int64)
    return [lax.rem(lax.div(offset, np.int64(s)), np.int64(n)) if n > 1 else 0 for n, s in zip(base_shape, base_stride)]


def _box(base, base_stride, size, stride, offset) -> tuple:
    """The box's first index and extent along each base dim, the window's dims of
    size > 1 and the base dims they run along, in the window's order."""
    dims = _box_dims(base.shape, tuple(base_stride), tuple(size), tuple(stride))
    along = [d for d in range(len(size)) if dims[d] is not None]
    block = [1] * base.ndim
    for d in along:
        block[dims[d]] = size[d]
    return _box_starts(base.shape, base_stride, offset), block, along, [dims[d] for d in along]


def _box_read(base, base_stride, size, stride, offset):
    starts, block, along, runs = _box(base, base_stride, size, stride, offset)
    x = lax.dynamic_slice(base, starts, block, allow_negative_indices=False)
    x = x.reshape([size[d] for _, d in sorted(zip(runs, along))])  # in the base's order
    return jnp.transpose(x, np.argsort(np.argsort(runs))).reshape(size)


def _box_write(base, value, base_stride, size, stride, offset):
    starts, block, along, runs = _box(base, base_stride, size, stride, offset)
    value = jnp.broadcast_to(value, size).astype(base.dtype).reshape([size[d] for d in along])
    block_value = jnp.transpose(value, np.argsort(runs)).reshape(block)  # in the base's order
    return lax.dynamic_update_slice(base, block_value, starts, allow_negative_indices=False)


def reinterpret(flat, dtype):
    """The 1-D ``flat`` as a 1-D array of ``dtype`` over the same bytes (Note [Dtype views]);
    a trailing part of an element is padded with zeros. XLA bitcasts no bools:
    torch's bool is the byte 0 or 1, read as any nonzero byte."""
    dtype = np.dtype(dtype)
    if flat.dtype == dtype:
        return flat
    if flat.dtype == np.bool_:
        return reinterpret(flat.astype(np.uint8), dtype)
    if dtype == np.bool_:
        return reinterpret(flat, np.uint8) != 0
    if jnp.issubdtype(flat.dtype, jnp.complexfloating):
        return reinterpret(jnp.stack([flat.real, flat.imag], -1).reshape(-1), dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        parts = reinterpret(flat, np.finfo(dtype).dtype)
        parts = jnp.pad(parts, (0, parts.shape[0] % 2)).reshape(-1, 2)
        return lax.complex(parts[:, 0], parts[:, 1])
    have, want = flat.dtype.itemsize, dtype.itemsize
    if have > want:
        return lax.bitcast_convert_type(flat, dtype).reshape(-1)
    if have < want:
        ratio = want // have
        flat = jnp.pad(flat, (0, -flat.shape[0] % ratio)).reshape(-1, ratio)
    return lax.bitcast_convert_type(flat, dtype)


@lowering(VIEW_READ)
def view_read(base, *, base_stride, size, stride, offset, dtype=None, conj=False, neg=False, box=False):
    """The window's values; ``conj`` and ``neg`` are its math bits (Note [Math bits])."""
    if box:
        return _math_bits(_box_read(base, base_stride, size, stride, offset), conj, neg)
    flat = to_flat(base, base_stride)
    if dtype is not None:
        flat = reinterpret(flat, _dtypes.to_jax(dtype))
    return _math_bits(window(flat, size, stride, offset), conj, neg)


def _math_bits(x, conj: bool, neg: bool):
    """``x`` conjugated and/or negated: each bit is its own inverse."""
    if conj:
        x = jnp.conj(x)
    return -x if neg else x


@lowering(VIEW_WRITE)
def view_write(base, value, *, base_stride, size, stride, offset, dtype=None, conj=False, neg=False, box=False):
    value = _math_bits(value, conj, neg)
    if box:
        return _box_write(base, value, base_stride, size, stride, offset)
    flat = to_flat(base, base_stride)
    if dtype is None:
        flat = write_window(flat, value, size, stride, offset)
    else:
        view_dtype = _dtypes.to_jax(dtype)
        if view_dtype == jnp.bool_ and flat.dtype != jnp.bool_:
            view_dtype, value = jnp.uint8, value.astype(jnp.uint8)  # the other bytes stay as they are
        written = write_window(reinterpret(flat, view_dtype), value, size, stride, offset)
        flat = reinterpret(written, flat.dtype)[: flat.shape[0]]
    return from_flat(flat, base.shape, base_stride)
