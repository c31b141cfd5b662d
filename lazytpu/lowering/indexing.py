"""Indexing: advanced indexing, index_put, gather/scatter, index_copy/fill, take.

Index tensors with integer dtype follow torch's (= numpy's) advanced-indexing
rules; negative indices wrap. Boolean masks have data-dependent shapes:
``index`` with a mask never reaches these rules, and ``index_put`` gets at
most one mask, alone among None entries (Note [Advanced indexing]).

Note [Bool accumulation]: XLA scatters cannot add, multiply, min or max
bools. Torch's bool arithmetic saturates (add is or, multiply is and), so
accumulating bools runs on int32 copies and maps back with ``!= 0``.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazytpu import _dtypes
from lazytpu.lowering import complex_math as cm
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _wrap(index, size):
    return jnp.where(index < 0, index + size, index)


def write_positions(indices: list, sizes: list, negative: bool = True) -> list:
    """The positions an index write (a scatter) writes at: ``indices`` wrapped, or
    all out of bounds, where the scatter drops them (``mode="drop"``), if any
    index lies outside ``[-size, size)`` (``negative``) or ``[0, size)``: the
    range its value check allows (Note [Failed writes change nothing] in
    lazytpu.frontend.checks.value_checks)."""
    bad = False
    for index, size in zip(indices, sizes):
        bad = bad | jnp.any((index < (-size if negative else 0)) | (index >= size))
    return [jnp.where(bad, size, _wrap(index, size)) for index, size in zip(indices, sizes)]


def _key(x, indices):
    """A numpy-style index tuple from aten's list of optional index tensors."""
    key = []
    for dim, idx in enumerate(indices):
        if idx is None:
            key.append(slice(None))
        elif idx.dtype == jnp.bool_:
            raise NotImplementedError("boolean index masks have data-dependent shapes")
        else:
            key.append(_wrap(idx, x.shape[dim]))
    return tuple(key)


@lowering(aten.index.Tensor)
def index(x, indices):
    return x[_key(x, indices)]


@lowering(aten.index_put)
def index_put(x, indices, values, accumulate=False):
    values = values.astype(x.dtype)
    masks = [i for i, idx in enumerate(indices) if idx is not None and idx.dtype == jnp.bool_]
    if masks:
        if len(masks) != 1 or any(idx is not None for i, idx in enumerate(indices) if i != masks[0]):
            raise NotImplementedError("index_put mixing a boolean mask with other indices (expanded when recorded)")
        return _put_masked(x, masks[0], indices[masks[0]], values, accumulate)
    if accumulate and x.dtype == jnp.bool_:
        return index_put(x.astype(jnp.int32), indices, values, True).astype(jnp.bool_)
    dims = [d for d, idx in enumerate(indices) if idx is not None]
    key = [slice(None)] * len(indices)
    for d, position in zip(dims, write_positions([indices[d] for d in dims], [x.shape[d] for d in dims])):
        key[d] = position
    at = x.at[tuple(key)]
    return at.add(values, mode="drop") if accumulate else at.set(values, mode="drop")


def _put_masked(x, p, mask, values, accumulate):
    """``x[..., mask, ...] = values`` without data-dependent shapes: the k-th
    True position takes ``values``' k-th row (a cumsum gives k)."""
    k = mask.ndim
    rest = x.shape[p + k :]
    nd = p + 1 + len(rest)
    v = values.reshape((1,) * (nd - values.ndim) + values.shape)
    if v.shape[p] == 0:  # no True element (torch checked the count at the call)
        return x
    if v.shape[p] == 1:
        v = v.reshape(v.shape[:p] + (1,) * k + v.shape[p + 1 :])
    else:
        rank = jnp.clip(jnp.cumsum(mask.reshape(-1)) - 1, 0).reshape(mask.shape)
        v = jnp.take(v, rank, axis=p)
    v = jnp.broadcast_to(v, x.shape)
    m = mask.reshape((1,) * p + mask.shape + (1,) * len(rest))
    return x + jnp.where(m, v, jnp.zeros((), x.dtype)) if accumulate else jnp.where(m, v, x)


@lowering(aten.put)
def put(x, index, source, accumulate=False):
    if accumulate and x.dtype == jnp.bool_:
        return put(x.astype(jnp.int32), index, source, True).astype(jnp.bool_)
    flat = x.reshape(-1)
    at = flat.at[write_positions([index.reshape(-1)], [flat.shape[0]])[0]]
    source = source.reshape(-1).astype(x.dtype)
    return (at.add(source, mode="drop") if accumulate else at.set(source, mode="drop")).reshape(x.shape)


def add_at(x, where, src):
    """``x.at[where].add(src)`` (out-of-range positions dropped). Half dtypes sum
    in float32 and round once, as CPU's scatter-add: a scatter in the half dtype
    rounds at every add (8.5% off with 16k updates of one row in bfloat16)."""
    if x.dtype in (jnp.bfloat16, jnp.float16):
        return x.astype(jnp.float32).at[where].add(src.astype(jnp.float32), mode="drop").astype(x.dtype)
    return x.at[where].add(src.astype(x.dtype), mode="drop")


def _axis_index(index, dim, ndim):
    """Index arrays selecting ``index`` along ``dim`` and everything elsewhere."""
    grids = jnp.meshgrid(*[jnp.arange(n) for n in index.shape], indexing="ij")
    return tuple(index if d == dim else grids[d] for d in range(ndim))


@lowering(aten.gather)
def gather(x, dim, index, *, sparse_grad=False):
    if index.ndim == 0 or x.ndim == 0:
        return x.reshape(-1)[index.reshape(-1)].reshape(index.shape)
    dim = dim % x.ndim
    return x[_axis_index(_wrap(index, x.shape[dim]), dim, x.ndim)]


def _scatter(x, dim, index, src, reduce=None):
    if index.size == 0:  # torch checks no shapes then: ``self`` as it was, whatever the index's rank
        return x
    if x.ndim == 0:
        x1 = x.reshape(1)
        return _scatter(
            x1, 0, index.reshape(-1), jnp.asarray(src).reshape(-1)[:1] if jnp.ndim(src) else src, reduce
        ).reshape(())
    if reduce is not None and x.dtype == jnp.bool_:  # Note [Bool accumulation]
        return _scatter(x.astype(jnp.int32), dim, index, jnp.asarray(src).astype(jnp.int32), reduce).astype(jnp.bool_)
    dim = dim % x.ndim
    src = jnp.broadcast_to(_dtypes.number(src, x.dtype), index.shape) if jnp.ndim(src) == 0 else src
    if jnp.ndim(src) and src.shape != index.shape:
        src = src[tuple(slice(0, n) for n in index.shape)]
    where = _axis_index(write_positions([index], [x.shape[dim]], negative=False)[0], dim, x.ndim)
    at = x.at[where]
    src = src.astype(x.dtype)
    if reduce is None:
        return at.set(src, mode="drop")
    if reduce in ("add", "sum"):
        return add_at(x, where, src)
    if reduce in ("multiply", "prod"):
        return at.multiply(src, mode="drop")
    if reduce == "amax":
        return at.max(src, mode="drop")
    if reduce == "amin":
        return at.min(src, mode="drop")
    raise NotImplementedError(f"scatter reduce={reduce!r}")


@lowering(aten.scatter.src, aten.scatter.value)
def scatter(x, dim, index, src):
    return _scatter(x, dim, index, src)


@lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(x, dim, index, src, *, reduce):
    return _scatter(x, dim, index, src, reduce)


@lowering(aten.scatter_add)
def scatter_add(x, dim, index, src):
    return _scatter(x, dim, index, src, "add")


@lowering(aten.scatter_reduce.two)
def scatter_reduce(x, dim, index, src, reduce, *, include_self=True):
    if x.dtype == jnp.bool_:  # Note [Bool accumulation]
        out = scatter_reduce(x.astype(jnp.int32), dim, index, src.astype(jnp.int32), reduce, include_self=include_self)
        return out.astype(jnp.bool_)
    if reduce == "mean":
        dim = dim % max(x.ndim, 1)
        total = _scatter(x if include_self else jnp.zeros_like(x), dim, index, src, "add")
        count = _scatter(
            jnp.ones_like(x) if include_self else jnp.zeros_like(x), dim, index, jnp.ones(index.shape, x.dtype), "add"
        )
        divisor = jnp.maximum(count, 1) if not jnp.iscomplexobj(count) else jnp.where(count == 0, 1, count)
        mean = cm.divide(total, divisor) if jnp.iscomplexobj(total) else total / divisor  # as div's
        out = mean if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.floor_divide(total, divisor)
        return jnp.where(count != 0, out, x)
    if include_self:
        return _scatter(x, dim, index, src, reduce)
    if reduce in ("sum", "prod"):
        identity = 0 if reduce == "sum" else 1
    else:  # amax/amin: never complex (torch refuses them)
        identity = _lowest(x.dtype) if reduce == "amax" else _highest(x.dtype)
    touched = _scatter(jnp.zeros(x.shape, jnp.bool_), dim, index, jnp.ones(index.shape, jnp.bool_))
    out = _scatter(jnp.full_like(x, identity), dim, index, src, reduce)
    return jnp.where(touched, out, x)


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _highest(dtype):
    return jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).max


def _along(x, dim, index, negative=False):
    key = [slice(None)] * x.ndim
    key[dim] = write_positions([index], [x.shape[dim]], negative)[0]
    return tuple(key)


def _scalar_write(x, index, value, negative=False):
    """A 0-d ``x`` written at ``index`` (each 0, or -1 if ``negative``; else nothing is written)."""
    ok = jnp.all((index == 0) | (index == -1)) if negative else jnp.all(index == 0)
    return jnp.where(ok, jnp.asarray(value).astype(x.dtype).reshape(()), x)


@lowering(aten.index_copy)
def index_copy(x, dim, index, source):
    if x.ndim == 0:
        return _scalar_write(x, index, source)
    dim = dim % x.ndim
    index = index.reshape(-1)  # a 0-d index is one index, and its source may be 0-d
    shape = x.shape[:dim] + index.shape + x.shape[dim + 1 :]
    return x.at[_along(x, dim, index)].set(source.reshape(shape).astype(x.dtype), mode="drop")


@lowering(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def index_fill(x, dim, index, value):
    if x.ndim == 0:
        return _scalar_write(x, index, _dtypes.number(value, x.dtype), negative=True)
    dim = dim % x.ndim
    return x.at[_along(x, dim, index, negative=True)].set(_dtypes.number(value, x.dtype), mode="drop")


@lowering(aten.take)
def take(x, index):
    return x.reshape(-1)[_wrap(index, x.size)]


@lowering(aten.repeat_interleave.Tensor)
def repeat_interleave(repeats, *, output_size):
    """Each position ``i`` written ``repeats[i]`` times. Only a call given its
    ``output_size`` gets here (a static shape; its value check holds the sum to
    it); without one the op is data-dependent (Note [Data-dependent shapes])."""
    if repeats.shape[0] == 0:  # nothing, whatever output_size says (as CPU)
        return repeats
    return jnp.repeat(jnp.arange(repeats.shape[0], dtype=repeats.dtype), repeats, total_repeat_length=output_size)
