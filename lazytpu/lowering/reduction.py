"""Reductions and scans: sum, mean, prod, extrema, moments, logic, cumulative ops.

Note [Reduction dims]: torch writes "which dims" as ``None``, an int or a list;
an empty list means every dim for most reductions (``sum(x, dim=[])``), but no
dim at all for ``any.dims``/``all.dims``. A 0-d tensor accepts dim ``0``/``-1``
and reduces over nothing.

Note [Accumulation dtype]: torch sums integers and bools in int64 and
accumulates float16/bfloat16 in float32; rules compute in that dtype and the
result is cast to torch's inferred dtype around the rule.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from lazytpu import _dtypes
from lazytpu.lowering.casts import convert, in_double
from lazytpu.lowering.elementwise import sqrt
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten

_HALF = (jnp.float16, jnp.bfloat16)


def axes(x, dim, *, empty_is_all: bool = True) -> tuple[int, ...]:
    """Normalized reduction axes of ``x`` (Note [Reduction dims])."""
    if dim is None or (empty_is_all and isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(x.ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    if x.ndim == 0:
        return ()
    return tuple(sorted({d % x.ndim for d in dims}))


def acc_dtype(x, dtype=None, *, ints_to_int64: bool = True):
    """The dtype torch computes a reduction in (Note [Accumulation dtype])."""
    if dtype is not None:
        target = _dtypes.to_jax(dtype)
    elif ints_to_int64 and (jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_):
        target = jnp.int64
    else:
        target = x.dtype
    return jnp.float32 if target in _HALF else target


def upcast(x):
    """Halves compute in float32, as torch's CPU kernels do."""
    return x.astype(jnp.float32) if x.dtype in _HALF else x


def count(x, ax) -> int:
    n = 1
    for a in ax:
        n *= x.shape[a]
    return n


# -- sums and products ---------------------------------------------------------


@lowering(aten.sum.default, aten.sum.dim_IntList)
def sum_(x, dim=None, keepdim=False, *, dtype=None):
    return jnp.sum(convert(x, acc_dtype(x, dtype)), axis=axes(x, dim), keepdims=keepdim)


@lowering(aten.nansum.default)
def nansum(x, dim=None, keepdim=False, *, dtype=None):
    x = convert(x, acc_dtype(x, dtype))
    if jnp.issubdtype(x.dtype, jnp.inexact):
        x = jnp.where(jnp.isnan(x), 0, x)
    return jnp.sum(x, axis=axes(x, dim), keepdims=keepdim)


@lowering(aten.mean.default, aten.mean.dim)
def mean(x, dim=None, keepdim=False, *, dtype=None):
    ax = axes(x, dim)
    total = jnp.sum(convert(x, acc_dtype(x, dtype)), axis=ax, keepdims=keepdim)
    return in_double(lambda t: t / count(x, ax), total)  # an exact quotient, as CPU's (Note [Exact quotients])


@lowering(aten.prod.default)
def prod(x, *, dtype=None):
    return jnp.prod(convert(x, acc_dtype(x, dtype)))


@lowering(aten.prod.dim_int)
def prod_dim(x, dim, keepdim=False, *, dtype=None):
    return jnp.prod(convert(x, acc_dtype(x, dtype)), axis=axes(x, dim), keepdims=keepdim)


# -- extrema -------------------------------------------------------------------


@lowering(aten.amax.default, aten.max.default)
def amax(x, dim=(), keepdim=False):
    return jnp.max(x, axis=axes(x, dim), keepdims=keepdim)


@lowering(aten.amin.default, aten.min.default)
def amin(x, dim=(), keepdim=False):
    return jnp.min(x, axis=axes(x, dim), keepdims=keepdim)


@lowering(aten.aminmax.default)
def aminmax(x, *, dim=None, keepdim=False):
    return amin(x, dim, keepdim), amax(x, dim, keepdim)


def _arg_extreme(x, dim, keepdim, find):
    """Index of the first extreme along ``dim`` (NaN counts as extreme, as in torch)."""
    if dim is None:
        index = find(x.reshape(-1), axis=0)
        return jnp.reshape(index, (1,) * x.ndim) if keepdim else index
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return find(x, axis=dim % x.ndim, keepdims=keepdim)


@lowering(aten.argmax.default)
def argmax(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, jnp.argmax)


@lowering(aten.argmin.default)
def argmin(x, dim=None, keepdim=False):
    return _arg_extreme(x, dim, keepdim, jnp.argmin)


@lowering(aten.max.dim)
def max_dim(x, dim, keepdim=False):
    return amax(x, dim, keepdim), argmax(x, dim, keepdim)


@lowering(aten.min.dim)
def min_dim(x, dim, keepdim=False):
    return amin(x, dim, keepdim), argmin(x, dim, keepdim)


# -- moments -------------------------------------------------------------------


def _var_mean(x, dim, correction, keepdim, *, take_sqrt=False, centered_on_mean=True):
    """Variance (or deviation) and mean as CPU torch computes them (Note [Double accumulation]);
    ``correction`` may be a traced scalar. ``centered_on_mean``: var and std of float32 or float64
    reducing to one element center on the mean in x's dtype (CPU's ``std_var_all_cpu``); var_mean
    and std_mean do not. Complex: the parts' variances added, as torch does."""
    ax = axes(x, dim)
    if jnp.iscomplexobj(x):
        parts = (_var_mean(p, dim, correction, keepdim, centered_on_mean=centered_on_mean) for p in (x.real, x.imag))
        (vr, mr), (vi, mi) = parts
        var = vr + vi
        return (jnp.sqrt(var) if take_sqrt else var), jax.lax.complex(mr, mi)
    dtype = x.dtype
    x = upcast(x)
    n = count(x, ax)
    to_one = (
        centered_on_mean and dtype not in _HALF and math.prod(x.shape[i] for i in range(x.ndim) if i not in ax) == 1
    )

    def moments(v):
        if to_one and v.dtype != dtype:  # widened: the mean rounded to x's dtype
            mu = (jnp.sum(x, axis=ax, keepdims=True).astype(v.dtype) / n).astype(dtype).astype(v.dtype)
        else:
            mu = jnp.sum(v, axis=ax, keepdims=True) / n
        centered = v - mu
        dof = n - (1 if correction is None else correction)
        divisor = jnp.where(dof > 0, dof, 0).astype(v.dtype)  # CPU's std::max(0, dof): a NaN one is 0
        var = jnp.sum(centered * centered, axis=ax, keepdims=keepdim) / divisor
        return (jnp.sqrt(var) if take_sqrt else var), (mu if keepdim else jnp.squeeze(mu, ax))

    return in_double(moments, x)


@lowering(aten.var.correction)
def var(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim)[0]


@lowering(aten.std.correction)
def std(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim, take_sqrt=True)[0]


@lowering(aten.var_mean.correction)
def var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim, centered_on_mean=False)


@lowering(aten.std_mean.correction)
def std_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var_mean(x, dim, correction, keepdim, take_sqrt=True, centered_on_mean=False)


# -- logic ---------------------------------------------------------------------


@lowering(aten.any.default, aten.any.dim, aten.any.dims, aten._is_any_true.default)
def any_(x, dim=None, keepdim=False):
    return jnp.any(x != 0, axis=axes(x, dim, empty_is_all=False), keepdims=keepdim)


@lowering(aten.all.default, aten.all.dim, aten.all.dims, aten._is_all_true.default)
def all_(x, dim=None, keepdim=False):
    return jnp.all(x != 0, axis=axes(x, dim, empty_is_all=False), keepdims=keepdim)


@lowering(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def count_nonzero(x, dim=None):
    return jnp.sum(x != 0, axis=axes(x, dim), dtype=jnp.int64)


@lowering(aten.nonzero_static.default)
def nonzero_static(x, *, size, fill_value=-1):
    """The indices of the first ``size`` nonzero elements in row-major order, a
    row each, then rows of ``fill_value``: a static shape, unlike ``nonzero``."""
    if x.ndim == 0 or x.size == 0:  # no index columns, or nothing found (jnp.nonzero would not fill)
        return jnp.full((size, x.ndim), fill_value, jnp.int64)
    found = jnp.nonzero(x, size=size, fill_value=fill_value)
    return jnp.stack(found, axis=1).astype(jnp.int64)


# -- log-sum-exp and scans -----------------------------------------------------


def _float_acc(x):
    """Integers compute in torch's default float dtype; halves in float32."""
    if jnp.issubdtype(x.dtype, jnp.inexact) and x.dtype not in _HALF:
        return x
    return x.astype(jnp.float32)


@lowering(aten.logsumexp.default)
def logsumexp(x, dim, keepdim=False):
    x = _float_acc(x)
    ax = axes(x, dim)
    if jnp.iscomplexobj(x):  # torch's formula (also over no axis: it wraps the angle), shifted by the largest real part
        shift = jnp.max(x.real, axis=ax, keepdims=True)
        shift = jnp.where(jnp.isinf(shift), 0, shift)
        total = jnp.log(jnp.sum(jnp.exp(x - shift), axis=ax, keepdims=keepdim))
        return total + (shift if keepdim else jnp.squeeze(shift, ax))
    if not ax:
        return x
    return jax.nn.logsumexp(x, axis=ax, keepdims=keepdim)


def _scan_axis(x, dim) -> int | None:
    return None if x.ndim == 0 else dim % x.ndim


@lowering(aten.cumsum.default)
def cumsum(x, dim, *, dtype=None):
    axis = _scan_axis(x, dim)
    x = convert(x, acc_dtype(x, dtype))
    return x if axis is None else in_double(lambda v: jnp.cumsum(v, axis=axis), x)  # Note [Double accumulation]


@lowering(aten.cumprod.default)
def cumprod(x, dim, *, dtype=None):
    axis = _scan_axis(x, dim)
    x = convert(x, acc_dtype(x, dtype))
    return x if axis is None else in_double(lambda v: jnp.cumprod(v, axis=axis), x)


@lowering(aten.logcumsumexp.default)
def logcumsumexp(x, dim):
    axis = _scan_axis(x, dim)
    x = _float_acc(x)
    if axis is None:
        return x
    if jnp.iscomplexobj(x):
        return in_double(lambda v: _complex_logcumsumexp(v, axis), x)
    return in_double(lambda v: jax.lax.cumlogsumexp(v, axis=axis), x)


def _complex_logcumsumexp(x, axis: int):
    """torch's CPU scan, element by element from -inf: each step keeps the
    imaginary part of the operand with the larger real part, so the result
    is on the same branch as CPU's (a tree of sums can differ by 2 pi)."""

    def step(acc, v):
        nan_v, nan_acc = jnp.isnan(v), jnp.isnan(acc)
        v_smaller = v.real < acc.real
        low = jnp.where(nan_acc, acc, jnp.where(nan_v, v, jnp.where(v_smaller, v, acc)))
        high = jnp.where(nan_acc, acc, jnp.where(nan_v, v, jnp.where(v_smaller, acc, v)))
        infinite = ~jnp.isfinite(low.real) & (low.real == high.real)
        out = jnp.where(
            jnp.isnan(low),
            jnp.asarray(complex(math.nan, math.nan), x.dtype),
            jnp.where(
                infinite,
                jnp.where(low.real < 0, low, jnp.log(jnp.exp(low) + jnp.exp(high))),
                jnp.log1p(jnp.exp(low - high)) + high,
            ),
        )
        return out, out

    xs = jnp.moveaxis(x, axis, 0)
    start = jnp.full(xs.shape[1:], -jnp.inf, x.dtype)
    _, out = jax.lax.scan(step, start, xs)
    return jnp.moveaxis(out, 0, axis)


@lowering(aten.linalg_vector_norm.default)
def linalg_vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """``torch.linalg.vector_norm``; ``ord`` is static (it picks the formula)."""
    x = x.astype(acc_dtype(x, dtype, ints_to_int64=False)) if dtype is not None else _float_acc(x)
    ax = axes(x, dim)
    a = jnp.abs(x)
    if ord == float("inf"):
        return jnp.max(a, axis=ax, keepdims=keepdim)
    if ord == float("-inf"):
        return jnp.min(a, axis=ax, keepdims=keepdim)
    if ord == 0:
        return jnp.sum((a != 0).astype(a.dtype), axis=ax, keepdims=keepdim)
    if ord == 1:
        return jnp.sum(a, axis=ax, keepdims=keepdim)
    if ord == 2:
        return sqrt(jnp.sum(a * a, axis=ax, keepdims=keepdim))
    return jnp.sum(a**ord, axis=ax, keepdims=keepdim) ** (1.0 / ord)
