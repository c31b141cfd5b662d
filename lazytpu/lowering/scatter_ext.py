"""Scatters into views, diagonal builders, rotations, windows, masked and
indexed reductions, running extrema and index factories.

The ``*_scatter`` ops are the functional forms of writing through a view
(``select``, ``slice``, ``diagonal``, ``as_strided``): the base with the window replaced.
``as_strided_scatter`` reads ``size``/``stride``/``storage_offset`` against the
base's contiguous layout (the layout of torch's ``clone`` of a dense base).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

from lazytpu.lowering.indexing import scatter_reduce
from lazytpu.lowering.registry import lowering
from lazytpu.lowering.shape import along_axis, wrap_dim
from lazytpu.lowering.strided import write_window

aten = torch.ops.aten


# -- scatters into views ---------------------------------------------------------


@lowering(aten.select_scatter)
def select_scatter(x, src, dim, index):
    dim = wrap_dim(dim, x.ndim)
    return x.at[along_axis(dim, index % x.shape[dim])].set(src.astype(x.dtype))


@lowering(aten.slice_scatter)
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    # In the base's dtype as CPU's copy into the slice (torch's decomposition promotes through ``where``)
    window = [slice(None)] * x.ndim
    window[wrap_dim(dim, x.ndim)] = slice(start, end, step)
    return x.at[tuple(window)].set(src.astype(x.dtype))


def set_diagonal(base, src, offset: int, dim1: int, dim2: int):
    """``base`` with its ``(offset, dim1, dim2)`` diagonal (``src``'s last dim) set to ``src``."""
    dim1, dim2 = wrap_dim(dim1, base.ndim), wrap_dim(dim2, base.ndim)
    moved = jnp.moveaxis(base, (dim1, dim2), (-2, -1))
    n = src.shape[-1]
    rows = jnp.arange(n) + max(-offset, 0)
    cols = jnp.arange(n) + max(offset, 0)
    return jnp.moveaxis(moved.at[..., rows, cols].set(src.astype(base.dtype)), (-2, -1), (dim1, dim2))


@lowering(aten.diagonal_scatter)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    return set_diagonal(x, src, offset, dim1, dim2)


@lowering(aten.as_strided_scatter)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    flat = write_window(x.reshape(-1), src, size, stride, storage_offset or 0)
    return flat.reshape(x.shape)


# -- diagonals, blocks, rotations, windows ----------------------------------------


@lowering(aten.diag_embed)
def diag_embed(x, offset=0, dim1=-2, dim2=-1):
    ndim = x.ndim + 1
    dim1, dim2 = wrap_dim(dim1, ndim), wrap_dim(dim2, ndim)
    n = x.shape[-1] + abs(offset)
    batch = list(x.shape[:-1])
    for d in sorted((dim1, dim2)):
        batch.insert(d, n)
    return set_diagonal(jnp.zeros(tuple(batch), x.dtype), x, offset, dim1, dim2)


@lowering(aten.block_diag)
def block_diag(tensors):
    dtype = jnp.result_type(*tensors)
    blocks = [t.reshape((1,) * (2 - t.ndim) + t.shape).astype(dtype) for t in tensors]
    out = jnp.zeros((sum(b.shape[0] for b in blocks), sum(b.shape[1] for b in blocks)), dtype)
    r = c = 0
    for b in blocks:
        out = out.at[r : r + b.shape[0], c : c + b.shape[1]].set(b)
        r, c = r + b.shape[0], c + b.shape[1]
    return out


@lowering(aten.rot90)
def rot90(x, k=1, dims=(0, 1)):
    return jnp.rot90(x, k, axes=tuple(wrap_dim(d, x.ndim) for d in dims))


def _unfold(x, dimension: int, size: int, step: int):
    if x.ndim == 0:
        return x.reshape((1,))
    dim = wrap_dim(dimension, x.ndim)
    count = (x.shape[dim] - size) // step + 1
    idx = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    out = jnp.moveaxis(x, dim, -1)[..., idx]  # (..., count, size)
    return jnp.moveaxis(out, -2, dim)


@lowering(aten.unfold_copy)
def unfold_copy(x, dimension, size, step):
    return _unfold(x, dimension, size, step)


@lowering(aten.unfold_backward)
def unfold_backward(grad, input_sizes, dim, size, step):
    """As CPU's kernel: ``grad`` broadcasts to the windows' shape in the other
    dims (``torch._refs.istft`` passes one row of windows for all rows), and
    holds its own count of windows in ``dim`` (the missing ones count zero)."""
    zeros = jnp.zeros(tuple(input_sizes), grad.dtype)
    windows, vjp = jax.vjp(lambda x: _unfold(x, dim, size, step), zeros)
    dim = dim % max(len(input_sizes), 1)
    if grad.ndim == windows.ndim and grad.shape[dim] < windows.shape[dim]:
        missing = windows.shape[dim] - grad.shape[dim]
        grad = jnp.pad(grad, [(0, missing if d == dim else 0) for d in range(grad.ndim)])
    return vjp(jnp.broadcast_to(grad, windows.shape))[0]


# -- masked scatter ------------------------------------------------------------------


def _rank(mask):
    """For each position of ``mask`` (flattened), how many True precede it."""
    flat = mask.reshape(-1)
    return jnp.cumsum(flat.astype(jnp.int64)) - flat.astype(jnp.int64)


@lowering(aten.masked_scatter)
def masked_scatter(x, mask, source):
    shape = jnp.broadcast_shapes(x.shape, mask.shape)
    x, mask = jnp.broadcast_to(x, shape), jnp.broadcast_to(mask, shape)
    if source.size == 0 or mask.size == 0:
        return x
    rank = _rank(mask)
    taken = source.reshape(-1)[jnp.clip(rank, 0, source.size - 1)].reshape(shape)
    # more True elements than source has: nothing is written (Note [Failed writes change nothing]
    # in lazytpu.frontend.checks.value_checks)
    enough = rank[-1] + mask.reshape(-1)[-1] <= source.size
    return jnp.where(mask & enough, taken.astype(x.dtype), x)


@lowering(aten.masked_scatter_backward)
def masked_scatter_backward(grad, mask, sizes):
    numel = int(np.prod(sizes))
    mask = jnp.broadcast_to(mask, grad.shape).reshape(-1)
    slot = jnp.where(mask, _rank(mask), numel)
    out = jnp.zeros((numel,), grad.dtype).at[slot].set(grad.reshape(-1), mode="drop")
    return out.reshape(tuple(sizes))


# -- indexed reductions ----------------------------------------------------------------


@lowering(aten.index_reduce)
def index_reduce(x, dim, index, source, reduce, *, include_self=True):
    if x.ndim == 0:
        return index_reduce(x.reshape(1), 0, index, source.reshape(-1), reduce, include_self=include_self).reshape(())
    dim = wrap_dim(dim, x.ndim)
    source = source.reshape(source.shape if source.ndim else (1,))
    shape = [1] * source.ndim
    shape[dim] = -1
    full = jnp.broadcast_to(index.reshape(shape), source.shape)
    return scatter_reduce(x, dim, full, source, reduce, include_self=include_self)


# -- running extrema ------------------------------------------------------------------


def _running(x, dim: int, later_wins):
    """Running extremum along ``dim`` with its index; ``later_wins(a, b)`` says
    whether the later value ``b`` replaces the earlier ``a`` (torch's rule: a NaN
    always does, nothing replaces a NaN, ties go to the later index)."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = wrap_dim(dim, x.ndim)
    iota = jax.lax.broadcasted_iota(jnp.int64, x.shape, axis)

    def combine(a, b):
        (av, ai), (bv, bi) = a, b
        take_b = later_wins(av, bv)
        if jnp.issubdtype(x.dtype, jnp.floating):
            take_b = jnp.isnan(bv) | (~jnp.isnan(av) & take_b)
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    if x.shape[axis] == 0:
        return x, iota
    return jax.lax.associative_scan(combine, (x, iota), axis=axis)


@lowering(aten.cummax)
def cummax(x, dim):
    return _running(x, dim, lambda a, b: b >= a)


@lowering(aten.cummin)
def cummin(x, dim):
    return _running(x, dim, lambda a, b: b <= a)


# -- index factories ------------------------------------------------------------------


def _tri_indices(rows, cols):
    return jnp.asarray(np.stack([rows, cols]).astype(np.int64).reshape(2, -1))


@lowering(aten.tril_indices)
def tril_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(*np.tril_indices(row, offset, col))


@lowering(aten.triu_indices)
def triu_indices(row, col, offset=0, *, dtype=None, layout=None, device=None, pin_memory=None):
    return _tri_indices(*np.triu_indices(row, offset, col))
