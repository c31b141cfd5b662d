"""Shape ops: the ``*_copy`` forms of views, joins, flips, gathers, backward ops.

View ops themselves (``view``, ``permute``, ``slice``, ``split``, ...) record
nothing: the dispatcher makes them windows on their base's storage (Note
[Views as strides]). What reaches these rules is their functional ``*_copy``
forms, the views that change the dtype (``view.dtype``), and the ops that make
new values: ``cat``, ``stack``, ``flip``, ``roll``, ``repeat``, ``index_select``
and the backward ops autograd emits for views.

Dims and sizes are Python ints (static). Rules normalize negative dims
themselves, since torch allows ``dim=-1`` (and ``dim=0`` or ``-1`` on a 0-d
tensor) where ``jnp`` is stricter. Backward ops (``slice_backward``,
``select_backward``, ...) scatter a gradient into zeros of the input's shape.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from lazytpu import _dtypes
from lazytpu.lowering.indexing import add_at, write_positions
from lazytpu.lowering.registry import lowering
from lazytpu.lowering.strided import reinterpret

aten = torch.ops.aten


def wrap_dim(d: int, ndim: int) -> int:
    """Torch's dim wrapping; a 0-d tensor accepts 0 and -1 as its one dim."""
    return d % max(ndim, 1)


def along_axis(dim: int, index) -> tuple:
    """An index tuple applying ``index`` on axis ``dim``."""
    return (slice(None),) * dim + (index,)


# -- reshapes ------------------------------------------------------------------


def _infer_size(size, numel: int) -> tuple:
    size = tuple(size)
    if -1 not in size:
        return size
    known = math.prod(s for s in size if s != -1)
    return tuple(numel // known if s == -1 else s for s in size)


@lowering(aten._unsafe_view, aten.view_copy.default)
def view(x, size):
    return jnp.reshape(x, _infer_size(size, x.size))


@lowering(aten.view.dtype, aten.view_copy.dtype)
def view_dtype(x, dtype):
    target = jnp.dtype(_dtypes.to_jax(dtype))
    if target == x.dtype:
        return x
    if x.dtype == jnp.bool_ or target == jnp.bool_:  # XLA bitcasts no bools: torch's bool is the byte 0 or 1
        flat = x.reshape(-1).astype(jnp.uint8) if x.dtype == jnp.bool_ else x.reshape(-1)
        out = reinterpret(flat, jnp.uint8 if target == jnp.bool_ else target)
        out = out.reshape(x.shape[:-1] + (-1,) if x.ndim else ())
        return out != 0 if target == jnp.bool_ else out
    if x.ndim == 0 or target.itemsize == x.dtype.itemsize:
        return lax.bitcast_convert_type(x, target)
    if target.itemsize < x.dtype.itemsize:  # each element becomes several
        out = lax.bitcast_convert_type(x, target)
        return out.reshape(x.shape[:-1] + (-1,))
    ratio = target.itemsize // x.dtype.itemsize
    return lax.bitcast_convert_type(x.reshape(x.shape[:-1] + (x.shape[-1] // ratio, ratio)), target)


@lowering(aten.squeeze_copy)
def squeeze(x, dim=None):
    if dim is None:
        dims = range(x.ndim)
    else:
        dims = (dim,) if isinstance(dim, int) else dim
    axes = tuple(d for d in {wrap_dim(d, x.ndim) for d in dims} if x.ndim and x.shape[d] == 1)
    return jnp.squeeze(x, axes) if axes else x


@lowering(aten.unsqueeze_copy)
def unsqueeze(x, dim):
    return jnp.expand_dims(x, dim % (x.ndim + 1))


# -- permutations and broadcasts -------------------------------------------------


@lowering(aten.permute_copy)
def permute(x, dims):
    return jnp.transpose(x, tuple(wrap_dim(d, x.ndim) for d in dims)) if x.ndim else x


@lowering(aten.transpose_copy.int)
def transpose(x, dim0, dim1):
    return jnp.swapaxes(x, wrap_dim(dim0, x.ndim), wrap_dim(dim1, x.ndim)) if x.ndim else x


@lowering(aten.t_copy)
def t(x):
    return x.T if x.ndim == 2 else x


@lowering(aten.expand_copy)
def expand(x, size, *, implicit=False):
    lead = len(size) - x.ndim
    size = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, size)


@lowering(aten.flip)
def flip(x, dims):
    return jnp.flip(x, tuple(wrap_dim(d, x.ndim) for d in dims)) if x.ndim and dims else x


@lowering(aten.roll)
def roll(x, shifts, dims=()):
    if not dims:  # torch rolls the flattened tensor
        return jnp.roll(x.reshape(-1), shifts[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(wrap_dim(d, x.ndim) for d in dims))


@lowering(aten.repeat)
def repeat(x, repeats):
    x = x.reshape((1,) * (len(repeats) - x.ndim) + x.shape)
    return jnp.tile(x, tuple(repeats))


@lowering(aten.constant_pad_nd)
def constant_pad_nd(x, pad, value=0):
    # ``pad`` pairs start at the last dim; negative amounts crop (lax.pad allows them).
    widths = [(0, 0, 0)] * (x.ndim - len(pad) // 2)
    widths += [(pad[2 * i], pad[2 * i + 1], 0) for i in reversed(range(len(pad) // 2))]
    return lax.pad(x, _dtypes.number(value, x.dtype), widths)


# -- slicing -------------------------------------------------------------------


@lowering(aten.slice_copy.Tensor)
def slice_(x, dim=0, start=None, end=None, step=1):
    # Python slicing clamps out-of-range bounds and wraps negatives as torch does.
    return x[along_axis(wrap_dim(dim, x.ndim), slice(start, end, step))]


@lowering(aten.select_copy.int)
def select(x, dim, index):
    dim = wrap_dim(dim, x.ndim)
    return x[along_axis(dim, index % x.shape[dim])]


@lowering(aten.slice_backward)
def slice_backward(grad, input_sizes, dim, start, end, step):
    zeros = jnp.zeros(tuple(input_sizes), grad.dtype)
    return zeros.at[along_axis(wrap_dim(dim, len(input_sizes)), slice(start, end, step))].set(grad)


@lowering(aten.select_backward)
def select_backward(grad, input_sizes, dim, index):
    dim = wrap_dim(dim, len(input_sizes))
    zeros = jnp.zeros(tuple(input_sizes), grad.dtype)
    return zeros.at[along_axis(dim, index % input_sizes[dim])].set(grad)


@lowering(aten.diagonal_copy)
def diagonal(x, offset=0, dim1=0, dim2=1):
    return jnp.diagonal(x, offset, wrap_dim(dim1, x.ndim), wrap_dim(dim2, x.ndim))


@lowering(aten.diagonal_backward)
def diagonal_backward(grad, input_sizes, offset, dim1, dim2):
    ndim = len(input_sizes)
    dim1, dim2 = wrap_dim(dim1, ndim), wrap_dim(dim2, ndim)
    zeros = jnp.moveaxis(jnp.zeros(tuple(input_sizes), grad.dtype), (dim1, dim2), (-2, -1))
    n = grad.shape[-1]
    rows = jnp.arange(n) + max(-offset, 0)
    cols = jnp.arange(n) + max(offset, 0)
    return jnp.moveaxis(zeros.at[..., rows, cols].set(grad), (-2, -1), (dim1, dim2))


# -- joining and splitting -------------------------------------------------------


@lowering(aten.cat)
def cat(tensors, dim=0):
    # torch skips legacy 1-d empty tensors whatever the others' rank.
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return tensors[0]
    dtype = jnp.result_type(*tensors)
    return jnp.concatenate([t.astype(dtype) for t in kept], axis=wrap_dim(dim, kept[0].ndim))


@lowering(aten.stack)
def stack(tensors, dim=0):
    dtype = jnp.result_type(*tensors)
    return jnp.stack([t.astype(dtype) for t in tensors], axis=dim % (tensors[0].ndim + 1))


def _split_at(x, dim: int, sizes) -> list:
    pieces, start = [], 0
    for size in sizes:
        pieces.append(x[along_axis(dim, slice(start, start + size))])
        start += size
    return pieces


@lowering(aten.split_copy.Tensor)
def split(x, split_size, dim=0):
    dim = wrap_dim(dim, x.ndim)
    n = x.shape[dim]
    count = max(-(-n // split_size), 1) if split_size else 1
    sizes = [split_size] * (count - 1) + [n - split_size * (count - 1)]
    return _split_at(x, dim, sizes)


@lowering(aten.split_with_sizes_copy)
def split_with_sizes(x, split_sizes, dim=0):
    return _split_at(x, wrap_dim(dim, x.ndim), split_sizes)


@lowering(aten.unbind_copy.int)
def unbind(x, dim=0):
    dim = wrap_dim(dim, x.ndim)
    return [x[along_axis(dim, i)] for i in range(x.shape[dim])]


# -- gathers along one dim ---------------------------------------------------------


@lowering(aten.index_select)
def index_select(x, dim, index):
    if x.ndim == 0:
        return x
    return jnp.take(x, index.reshape(-1), axis=wrap_dim(dim, x.ndim), mode="clip")


@lowering(aten.index_add)
def index_add(x, dim, index, source, *, alpha=1):
    if x.dtype == jnp.bool_:  # Note [Bool accumulation] in lowering/indexing.py
        return index_add(x.astype(jnp.int32), dim, index, source.astype(jnp.int32), alpha=int(alpha)).astype(jnp.bool_)
    if x.ndim == 0:
        return jnp.where(jnp.all(index == 0), x + alpha * source.reshape(()), x)
    dim = wrap_dim(dim, x.ndim)
    source = source.reshape(source.shape if source.ndim else (1,))
    # Note [Failed writes change nothing] in lazytpu.frontend.checks.value_checks
    (position,) = write_positions([index.reshape(-1)], [x.shape[dim]], negative=False)
    if type(alpha) is int and alpha == 1:  # CPU's scatter-add (half updates summed in float32)
        return add_at(x, along_axis(dim, position), source)
    # with another alpha CPU adds slice by slice, rounding each add: as this scatter, up to the order
    return x.at[along_axis(dim, position)].add((alpha * source).astype(x.dtype), mode="drop")
