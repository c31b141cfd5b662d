"""Sorting and order statistics: sort, topk, kthvalue, median, mode,
searchsorted/bucketize (and CSR row pointers) and histograms (static bin counts, so static shapes).

Note [NaN order]: torch orders NaN above every number: an ascending sort puts
NaNs last, a descending one first; ``topk`` takes them as the largest values;
``median`` returns NaN (and a NaN's index) when a slice holds one.

Note [Stable ties]: every sort here is stable, so ties keep their input order
(torch's CPU sort does too); a descending sort reverses the order of values,
not of ties.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from lazytpu.lowering.casts import convert
from lazytpu.lowering.factories import two_sided
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _descending_keys(x) -> tuple:
    """Sort keys whose ascending order is ``x``'s descending one (Note [NaN order])."""
    if jnp.issubdtype(x.dtype, jnp.floating):
        return (jnp.where(jnp.isnan(x), 0, 1).astype(jnp.int8), -x)
    if x.dtype == jnp.bool_:
        return (~x,)
    return (~x,)  # bitwise not reverses signed and unsigned integer order without overflow


def sort_along(x, axis: int, descending: bool = False):
    """``(values, int64 indices)`` of a stable sort of ``x`` along ``axis``."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    iota = lax.broadcasted_iota(jnp.int64, x.shape, axis)
    keys = _descending_keys(x) if descending else (x,)
    out = lax.sort((*keys, x, iota), dimension=axis, is_stable=True, num_keys=len(keys))
    return out[-2], out[-1]


def _axis(x, dim: int) -> int:
    return dim % x.ndim if x.ndim else 0


@lowering(aten.sort.default)
def sort(x, dim=-1, descending=False):
    return sort_along(x, _axis(x, dim), descending)


@lowering(aten.sort.stable)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    return sort_along(x, _axis(x, dim), descending)


@lowering(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):  # noqa: A002 - torch's argument name
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(x, dim)
    n = x.shape[axis]
    # ties replayed unless torch takes partial_sort or introsorts the first k - 1 (Note [Selection ties])
    if k == 0 or n > _SELECT_LIMIT or k * 64 <= n or (sorted and k - 1 > 16):
        values, indices = sort_along(x, axis, descending=largest)
        return lax.slice_in_dim(values, 0, k, axis=axis), lax.slice_in_dim(indices, 0, k, axis=axis)
    rows = jnp.moveaxis(x, axis, -1)
    v, i = jax.vmap(lambda r: _nth_element_row(r, k, largest, sorted))(rows.reshape(-1, n))
    shape = rows.shape[:-1] + (k,)
    return jnp.moveaxis(v.reshape(shape), -1, axis), jnp.moveaxis(i.reshape(shape), -1, axis)


def _before(largest: bool):
    """topk's comparator: whether ``a`` goes before ``b`` (NaN counts as largest)."""
    if largest:
        return _greater
    return lambda a, b: _greater(b, a)


def _window_sort(arr, idx, lo, hi, largest: bool):
    """Positions ``[lo, hi)`` stably sorted in topk's order, the rest kept
    (libstdc++'s insertion sort, which it uses for short ranges)."""
    pos = jnp.arange(arr.shape[0])
    group = jnp.where(pos < lo, 0, jnp.where(pos < hi, 1, 2)).astype(jnp.int8)
    keys = _descending_keys(arr) if largest else (jnp.where(jnp.isnan(arr), 1, 0).astype(jnp.int8), arr)
    if not jnp.issubdtype(arr.dtype, jnp.floating) and not largest:
        keys = (arr,)
    keys = tuple(jnp.where(group == 1, key, jnp.zeros((), key.dtype)) for key in keys)
    out = lax.sort((group, *keys, pos, arr, idx), is_stable=True, num_keys=len(keys) + 2)
    return out[-2], out[-1]


def _partition(arr, idx, first, last, before):
    """libstdc++'s ``__unguarded_partition_pivot`` on ``[first, last)``: the
    median of three moved to ``first``, then Hoare's partition around it.
    Returns the arrays and the cut. The scans' bounds never bind on a live
    range (the median of three is a sentinel); they end a finished row's
    loop under ``vmap``."""
    n = arr.shape[0]
    a, b, c = first + 1, first + (last - first) // 2, last - 1
    ab, bc, ac = before(arr[a], arr[b]), before(arr[b], arr[c]), before(arr[a], arr[c])
    median = jnp.where(ab, jnp.where(bc, b, jnp.where(ac, c, a)), jnp.where(ac, a, jnp.where(bc, c, b)))
    arr, idx = _swap((arr, idx), first, median)
    piv = arr[first]

    def scan(c):
        arr, idx, lo, hi, _ = c
        lo = lax.while_loop(lambda i: (i < n - 1) & before(arr[i], piv), lambda i: i + 1, lo)
        hi = lax.while_loop(lambda j: (j > 0) & before(piv, arr[j]), lambda j: j - 1, hi - 1)
        done = lo >= hi
        arr, idx = _swap((arr, idx), lo, hi, ~done)
        return arr, idx, jnp.where(done, lo, lo + 1), hi, done

    arr, idx, cut, _, _ = lax.while_loop(lambda c: ~c[4], scan, (arr, idx, first + 1, last, jnp.asarray(False)))
    return arr, idx, cut


def _introsort_row(arr):
    """libstdc++'s ``std::sort`` of ``(value, index)`` pairs by value, as
    torch's CPU ``mode`` runs it (Note [Selection ties]): the introsort loop
    partitions ranges longer than 16 (an explicit stack instead of
    recursion; ranges are disjoint, so the order they are taken in does not
    matter), then the final insertion sort, which on such a partitioned
    array is a stable sort. Heapsort after 2 log2(n) levels is not replayed."""
    n = arr.shape[0]
    before = lambda a, b: a < b  # noqa: E731 - torch's comparator, NaN-unaware as on CPU
    depth = 64
    zero = jnp.asarray(0, jnp.int64)
    stack = jnp.zeros((depth, 2), jnp.int64).at[0].set(jnp.array([0, n], jnp.int64))

    def step(c):
        arr, idx, stack, sp = c
        first, last = stack[sp - 1, 0], stack[sp - 1, 1]
        sp = sp - 1
        big = last - first > 16
        parr, pidx, cut = _partition(arr, idx, first, jnp.where(big, last, first + 17).clip(max=n), before)
        arr, idx = jnp.where(big, parr, arr), jnp.where(big, pidx, idx)
        pushed = stack.at[sp].set(jnp.stack([cut, last])).at[sp + 1].set(jnp.stack([first, cut]))
        stack = jnp.where(big, pushed, stack)
        return arr, idx, stack, jnp.where(big, (sp + 2).clip(max=depth), sp)

    idx = jnp.arange(n, dtype=jnp.int64)
    arr, idx, _, _ = lax.while_loop(lambda c: c[3] > 0, step, (arr, idx, stack, zero + 1))
    out = lax.sort((arr, jnp.arange(n), idx), is_stable=True, num_keys=1)
    return out[0], out[2]


def _nth_element_row(arr, k: int, largest: bool, sorted: bool):  # noqa: A002
    """torch's CPU topk on one row (Note [Selection ties]): libstdc++'s
    ``nth_element`` (median-of-three introselect, insertion sort below four
    elements), then the first ``k - 1`` sorted; the same swaps, so that ties
    come out in the same order."""
    n = arr.shape[0]
    before = _before(largest)
    state = (arr, jnp.arange(n, dtype=jnp.int64))

    def step(c):
        arr, idx, first, last = c
        arr, idx, cut = _partition(arr, idx, first, last, before)
        return arr, idx, jnp.where(cut <= k - 1, cut, first), jnp.where(cut <= k - 1, last, cut)

    zero = jnp.asarray(0, jnp.int64)
    arr, idx, first, last = lax.while_loop(lambda c: c[3] - c[2] > 3, step, (*state, zero, zero + n))
    arr, idx = _window_sort(arr, idx, first, last, largest)
    if sorted:
        arr, idx = _window_sort(arr, idx, 0, k - 1, largest)
    return arr[:k], idx[:k]


def _take(values, indices, axis: int, position, keepdim: bool):
    """The ``position``-th entry along ``axis`` of both arrays (``position``
    broadcast against the other axes)."""
    pos = jnp.expand_dims(jnp.asarray(position, jnp.int64), axis) if jnp.ndim(position) else position
    if jnp.ndim(pos) == 0:
        pos = jnp.full(values.shape[:axis] + (1,) + values.shape[axis + 1 :], pos, jnp.int64)
    v = jnp.take_along_axis(values, pos, axis=axis)
    i = jnp.take_along_axis(indices, pos, axis=axis)
    return (v, i) if keepdim else (jnp.squeeze(v, axis), jnp.squeeze(i, axis))


def _greater(a, b):
    """torch's selection order: NaN above every number."""
    if jnp.issubdtype(a.dtype, jnp.floating):
        return (jnp.isnan(a) & ~jnp.isnan(b)) | (a > b)
    return a > b


def _swap(state, a, b, when=True):
    """``(values, indices)`` with positions ``a`` and ``b`` exchanged where ``when``."""
    arr, idx = state
    sa, sb = jnp.where(when, b, a), jnp.where(when, a, b)
    return arr.at[a].set(arr[sa]).at[b].set(arr[sb]), idx.at[a].set(idx[sa]).at[b].set(idx[sb])


def _quickselect_row(arr, k: int):
    """torch's ``quick_select_template`` on one row (Note [Selection ties]):
    ``(arr, indices)`` after the same swaps, so that position ``k`` holds
    the same value and index as on CPU torch."""
    n = arr.shape[0]
    idx = jnp.arange(n, dtype=jnp.int64)

    swap = _swap

    def partition(state, lo, hi):
        p = lo + (hi - lo) // 2
        state = swap(state, p, lo + 1)
        state = swap(state, lo + 1, hi, _greater(state[0][lo + 1], state[0][hi]))
        state = swap(state, lo, hi, _greater(state[0][lo], state[0][hi]))
        state = swap(state, lo + 1, lo, _greater(state[0][lo + 1], state[0][lo]))
        piv = state[0][lo]

        def scan(c):  # one round: advance i and j, swap unless they crossed
            arr, idx, i, j, _ = c
            i = lax.while_loop(lambda i: (i < hi) & _greater(piv, arr[i]), lambda i: i + 1, i + 1)
            j = lax.while_loop(lambda j: (j > lo) & _greater(arr[j], piv), lambda j: j - 1, j - 1)
            crossed = j < i
            arr, idx = swap((arr, idx), i, j, ~crossed)
            return arr, idx, i, j, crossed

        arr, idx, i, j, _ = lax.while_loop(lambda c: ~c[4], scan, (*state, lo + 1, hi, jnp.asarray(False)))
        return swap((arr, idx), lo, j), i, j

    def step(c):
        arr, idx, lo, hi = c
        pair = hi == lo + 1
        two = swap((arr, idx), lo, hi, pair & _greater(arr[lo], arr[hi]))
        (parr, pidx), i, j = partition((arr, idx), lo, jnp.maximum(hi, lo + 2).clip(max=n - 1))
        arr = jnp.where(pair, two[0], parr)
        idx = jnp.where(pair, two[1], pidx)
        new_lo = jnp.where(pair, hi, jnp.where(j <= k, i, lo))
        new_hi = jnp.where(pair, hi, jnp.where(j >= k, j - 1, hi))
        return arr, idx, new_lo, new_hi

    zero = jnp.asarray(0, jnp.int64)
    arr, idx, _, _ = lax.while_loop(lambda c: c[2] < c[3], step, (arr, idx, zero, zero + n - 1))
    return arr[k], idx[k]


@lowering(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(x, dim)
    n = x.shape[axis]
    if n > _SELECT_LIMIT or n < 3:
        values, indices = sort_along(x, axis)
        return _take(values, indices, axis, k - 1, keepdim)
    rows = jnp.moveaxis(x, axis, -1)
    v, i = jax.vmap(lambda r: _quickselect_row(r, k - 1))(rows.reshape(-1, n))
    v, i = v.reshape(rows.shape[:-1]), i.reshape(rows.shape[:-1])
    return (jnp.expand_dims(v, axis), jnp.expand_dims(i, axis)) if keepdim else (v, i)


# Note [Selection ties]: torch's CPU kthvalue runs its own quickselect, so
# among equal values the index it reports depends on that algorithm's swaps.
# Rows up to this length replay those swaps exactly (a sequential loop);
# longer rows take a stable sort, whose tie index may differ from torch's.
_SELECT_LIMIT = 4096


def _median(x, axis: int, keepdim: bool, *, skip_nan: bool):
    """Lower median along ``axis`` (Note [NaN order])."""
    values, indices = sort_along(x, axis)
    n = x.shape[axis]
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return _take(values, indices, axis, (n - 1) // 2, keepdim)
    valid = jnp.sum(~jnp.isnan(x), axis=axis)
    if skip_nan:
        position = jnp.maximum((valid - 1) // 2, 0)
    else:  # any NaN: the first NaN (sorted last) is the answer
        position = jnp.where(valid < n, valid, (n - 1) // 2)
    return _take(values, indices, axis, position, keepdim)


def _empty_median(x):
    """CPU torch's median of no elements: NaN, cast to ``x``'s dtype as CPU casts it
    (int64's smallest value, 0 for uint8)."""
    nan = jnp.sum(x.astype(jnp.float32)) + jnp.nan  # traced: numpy would warn casting a NaN constant
    return convert(nan, x.dtype)


@lowering(aten.median.default)
def median(x):
    if x.size == 0:
        return _empty_median(x)
    return _median(x.reshape(-1), 0, False, skip_nan=False)[0]


@lowering(aten.nanmedian.default)
def nanmedian(x):
    if x.size == 0:
        return _empty_median(x)
    return _median(x.reshape(-1), 0, False, skip_nan=True)[0]


@lowering(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    return _median(x, _axis(x, dim), keepdim, skip_nan=False)


@lowering(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    return _median(x, _axis(x, dim), keepdim, skip_nan=True)


@lowering(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    """The most frequent value (the smallest on ties) and the index that ends its run in torch's sort."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    axis = _axis(x, dim)
    rows = jnp.moveaxis(x, axis, -1)
    n = rows.shape[-1]
    if 16 < n <= _SELECT_LIMIT:  # Note [Selection ties]: std::sort's order decides which index of a run is last
        values, indices = jax.vmap(_introsort_row)(rows.reshape(-1, n))
        values, indices = values.reshape(rows.shape), indices.reshape(rows.shape)
    else:
        values, indices = sort_along(rows, x.ndim - 1)
    if n == 0:
        out = values[..., :1], indices[..., :1]
    else:
        new_run = jnp.concatenate([jnp.ones_like(values[..., :1], bool), values[..., 1:] != values[..., :-1]], -1)
        run_start = lax.cummax(jnp.where(new_run, jnp.arange(n), 0), axis=values.ndim - 1)
        length = jnp.arange(n) - run_start + 1  # run length so far, at each position
        best = jnp.argmax(length, axis=-1, keepdims=True)  # first longest run: the smallest value
        out = jnp.take_along_axis(values, best, -1), jnp.take_along_axis(indices, best, -1)
    v, i = (jnp.moveaxis(o, -1, axis) for o in out)
    return (v, i) if keepdim else (jnp.squeeze(v, axis), jnp.squeeze(i, axis))


# -- searching -----------------------------------------------------------------


def _searchsorted(boundaries, x, *, right: bool, side, sorter):
    if sorter is not None:
        boundaries = jnp.take_along_axis(boundaries, sorter, axis=-1)
    how = "right" if (side == "right" or (side is None and right)) else "left"
    if boundaries.shape[-1] == 0 or x.size == 0:
        return jnp.zeros(x.shape, jnp.int64)
    if boundaries.ndim == 1:
        return jnp.searchsorted(boundaries, x, side=how)
    batch = boundaries.shape[:-1]
    flat_b = boundaries.reshape((-1, boundaries.shape[-1]))
    flat_x = x.reshape((flat_b.shape[0], -1))
    out = jax.vmap(lambda b, v: jnp.searchsorted(b, v, side=how))(flat_b, flat_x)
    return out.reshape(batch + x.shape[len(batch) :])


@lowering(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(boundaries, x, *, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(boundaries, jnp.asarray(x, boundaries.dtype), right=right, side=side, sorter=sorter)


@lowering(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(x, boundaries, *, out_int32=False, right=False):
    return _searchsorted(boundaries, jnp.asarray(x, boundaries.dtype), right=right, side=None, sorter=None)


@lowering(aten._convert_indices_from_coo_to_csr.default)
def coo_to_csr(rows, size: int, *, out_int32=False):
    """A CSR row pointer from sorted COO row indices: how many of them lie below each row 0..size."""
    return _searchsorted(rows, jnp.arange(size + 1, dtype=rows.dtype), right=False, side=None, sorter=None)


@lowering(aten._convert_indices_from_csr_to_coo.default)
def csr_to_coo(crow, col, *, out_int32=False, transpose=False):
    """COO indices (2, nnz) from a CSR row pointer and column indices: each entry's row."""
    row = _searchsorted(crow[1:], jnp.arange(col.shape[0], dtype=crow.dtype), right=True, side=None, sorter=None)
    return jnp.stack([col, row] if transpose else [row, col])


# -- histograms ----------------------------------------------------------------


def _bin_counts(x, index, inside, bins: int, weight=None):
    w = inside.astype(x.dtype) if weight is None else jnp.where(inside, weight, 0).astype(x.dtype)
    return jnp.zeros((bins,), x.dtype).at[jnp.where(inside, index, 0)].add(w)


def _rounding(dtype):
    """Round after each op as torch's Half/BFloat16 arithmetic does (XLA may
    keep a chain of half-precision ops in float32)."""
    if jnp.dtype(dtype) not in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)):
        return lambda v: v
    info = jnp.finfo(dtype)
    return lambda v: lax.reduce_precision(v.astype(jnp.float32), info.nexp, info.nmant)


def _linear_bins(x, lo, hi, bins: int):
    """Bin of each ``x`` among ``bins`` equal bins of ``[lo, hi]`` (the last
    one closed), as torch computes it, and whether it falls inside."""
    if jnp.issubdtype(x.dtype, jnp.integer):  # CUDA's integer arithmetic (Note [CUDA's histc])
        index = (x.astype(jnp.int64) - lo) * bins // (hi.astype(jnp.int64) - lo)
    else:
        r = _rounding(x.dtype)
        index = jnp.floor(r(r(r(x - lo) * bins) / r(hi - lo))).astype(jnp.int64)
    index = jnp.where(x == hi, bins - 1, index)
    inside = (x >= lo) & (x <= hi) & ~jnp.isnan(x)
    return jnp.clip(index, 0, bins - 1), inside


@lowering(aten.histc.default)
def histc(x, bins=100, min=0, max=0):  # noqa: A002 - torch's argument names
    flat = x.reshape(-1)
    empty = flat.size == 0
    lo = jnp.asarray(min, x.dtype)
    hi = jnp.asarray(max, x.dtype)
    data_lo = jnp.asarray(0, x.dtype) if empty else jnp.min(flat)
    data_hi = jnp.asarray(0, x.dtype) if empty else jnp.max(flat)
    same = lo == hi
    lo, hi = jnp.where(same, data_lo, lo), jnp.where(same, data_hi, hi)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    index, inside = _linear_bins(flat, lo, hi, bins)
    return _bin_counts(flat, index, inside, bins)


def _edges(x, bins: int, range_):
    """torch's bin edges of ``bins`` equal bins over ``range_``, or over the
    data (``[0, 1]`` when empty); a zero-width range widens by 0.5 each way."""
    if range_ is not None:
        lo, hi = (jnp.asarray(v, jnp.float64) for v in range_)
    elif x.size:
        lo, hi = jnp.min(x).astype(jnp.float64), jnp.max(x).astype(jnp.float64)
    else:
        lo, hi = jnp.float64(0), jnp.float64(1)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 0.5, lo), jnp.where(same, hi + 0.5, hi)
    return two_sided(lo.astype(x.dtype), hi.astype(x.dtype), bins + 1, x.dtype)


def _histogramdd(x, edges, weight, density: bool):
    """Counts of the rows of ``x`` (``(..., D)``) in the grid of ``edges``
    (one array per dim; each dim's last bin closed)."""
    flat = x.reshape(-1, len(edges))
    bins = tuple(e.shape[0] - 1 for e in edges)
    index = jnp.zeros(flat.shape[:1], jnp.int64)
    inside = jnp.ones(flat.shape[:1], bool)
    for d, e in enumerate(edges):
        col = flat[:, d]
        pos = jnp.clip(jnp.searchsorted(e, col, side="right") - 1, 0, bins[d] - 1)
        inside = inside & (col >= e[0]) & (col <= e[-1])
        index = index * bins[d] + pos
    total = math.prod(bins)
    hist = _bin_counts(flat, index, inside, total, None if weight is None else weight.reshape(-1)).reshape(bins)
    if density:
        hist = hist / jnp.sum(hist)
        for d, e in enumerate(edges):
            hist = hist / jnp.diff(e).reshape(tuple(-1 if k == d else 1 for k in range(len(edges))))
    return hist


@lowering(aten.histogram.bin_ct)
def histogram(x, bins=100, *, range=None, weight=None, density=False):  # noqa: A002
    edges = _edges(x.reshape(-1), bins, range)
    return _histogramdd(x.reshape(-1, 1), [edges], weight, density), edges


@lowering(aten.histogram.bins_tensor)
def histogram_edges(x, bins, *, weight=None, density=False):
    return _histogramdd(x.reshape(-1, 1), [bins], weight, density), bins


def _columns(x):
    return x.reshape(-1, x.shape[-1])


@lowering(aten._histogramdd_bin_edges)
def histogramdd_bin_edges(x, bins, *, range=None, weight=None, density=False):  # noqa: A002
    cols = _columns(x)
    return [_edges(cols[:, d], n, None if range is None else range[2 * d : 2 * d + 2]) for d, n in enumerate(bins)]


@lowering(aten._histogramdd_from_bin_cts)
def histogramdd_from_bin_cts(x, bins, *, range=None, weight=None, density=False):  # noqa: A002
    return _histogramdd(x, histogramdd_bin_edges(x, bins, range=range), weight, density)


@lowering(aten._histogramdd_from_bin_tensors)
def histogramdd_from_bin_tensors(x, bins, *, weight=None, density=False):
    return _histogramdd(x, list(bins), weight, density)
