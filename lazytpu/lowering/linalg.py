"""Matrix products (mm, bmm, mv, dot and their ``add*`` forms; cross and
``_trilinear``), trace and triangles.

``matmul`` and ``linear`` are CompositeImplicit in torch: they arrive here
already decomposed into these ops plus views.

Note [Scaled adds]: ``addmm`` and friends compute ``beta * self + alpha *
(a @ b)``; when ``beta`` is zero torch ignores ``self`` entirely (NaN and inf
in it do not propagate), so the rule selects instead of multiplying.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _truncated(scalar, dtype):
    """A (possibly lifted) scalar as an integer of ``dtype``, truncated."""
    return scalar if isinstance(scalar, int) else jnp.asarray(scalar).astype(dtype)


def _scaled_add(bias, product, beta, alpha):
    """``beta * bias + alpha * product`` (Note [Scaled adds]). Integer results
    take the scalars truncated to integers, as torch's CPU kernels do."""
    if jnp.issubdtype(bias.dtype, jnp.integer) or bias.dtype == jnp.bool_:
        beta, alpha = _truncated(beta, bias.dtype), _truncated(alpha, bias.dtype)
    scaled = product if isinstance(alpha, int) and alpha == 1 else alpha * product
    if isinstance(beta, int) and beta == 1:
        return bias + scaled
    kept = jnp.where(beta == 0, jnp.zeros_like(bias), beta * bias)
    return kept + scaled


@lowering(aten.mm, aten.bmm, aten.mv)
def matmul(x, y):
    return jnp.matmul(x, y)


@lowering(aten.dot)
def dot(x, y):
    return jnp.dot(x, y)


@lowering(aten.vdot)
def vdot(x, y):
    return jnp.vdot(x, y)


def _half_as_float(*arrays):
    """Half-precision products accumulate and scale in float32, rounded once
    at the end (torch's CPU GEMM paths)."""
    if arrays[0].dtype in (jnp.bfloat16, jnp.float16):
        return tuple(a.astype(jnp.float32) for a in arrays)
    return arrays


@lowering(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)
def addmm(bias, x, y, *, beta=1, alpha=1):
    bias, x, y = _half_as_float(bias, x, y)
    return _scaled_add(bias, jnp.matmul(x, y), beta, alpha)


@lowering(aten.addbmm.default)
def addbmm(bias, x, y, *, beta=1, alpha=1):
    """Half precision: one ``addmm`` per batch, rounded after each (torch's
    CPU loop); otherwise one contraction."""
    dtype = bias.dtype
    if dtype not in (jnp.bfloat16, jnp.float16) or x.shape[0] == 0:
        bias, x, y = _half_as_float(bias, x, y)
        return _scaled_add(bias, jnp.einsum("bij,bjk->ik", x, y), beta, alpha)
    first = addmm(jnp.broadcast_to(bias, (x.shape[1], y.shape[2])), x[0], y[0], beta=beta, alpha=alpha)
    return jax.lax.fori_loop(
        1, x.shape[0], lambda k, out: addmm(out, x[k], y[k], alpha=alpha).astype(dtype), first.astype(dtype)
    )


@lowering(aten.addr.default)
def addr(bias, x, y, *, beta=1, alpha=1):
    """Element-wise in the operands' common dtype, as torch's CPU kernel:
    ``beta * self + (alpha * x_i) * y_j`` with the scalars in that dtype
    (``self`` expanded first: a 0-dim one promotes as a dimensioned one)."""
    common = jnp.result_type(bias, x, y)
    bias, x, y = (a.astype(common) for a in (bias, x, y))
    if jnp.issubdtype(bias.dtype, jnp.floating) and not isinstance(alpha, int):
        alpha = jnp.asarray(alpha).astype(bias.dtype)
        x = alpha * x
        alpha = 1
    if jnp.issubdtype(bias.dtype, jnp.floating) and not isinstance(beta, int):
        beta = jnp.asarray(beta).astype(bias.dtype)
    return _scaled_add(bias, jnp.outer(x, y), beta, alpha)


@lowering(aten.tril)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowering(aten.triu)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)


# -- cross, trace, _trilinear ---------------------------------------------------


@lowering(aten.linalg_cross.default)
def linalg_cross(x, y, *, dim=-1):
    x, y = jnp.broadcast_arrays(x, y)
    return jnp.cross(x, y, axis=dim)


@lowering(aten.trace.default)
def trace(x):
    return jnp.trace(x)


@lowering(aten._trilinear.default)
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """``(i1 * i2 * i3).sum(sumdim)`` after unsqueezing each at its ``expand`` dims."""
    x = jnp.expand_dims(i1, tuple(expand1)) if expand1 else i1
    y = jnp.expand_dims(i2, tuple(expand2)) if expand2 else i2
    z = jnp.expand_dims(i3, tuple(expand3)) if expand3 else i3
    if i1.dtype in (jnp.float16, jnp.bfloat16):
        return _trilinear_half(x, y, z, set(expand3), set(sumdim), unroll_dim)
    out = x * y * z
    return jnp.sum(out, axis=tuple(sumdim)) if sumdim else out


def _trilinear_half(x, y, z, expand3, sumdim, unroll_dim):
    """torch's CPU ``_trilinear`` in a half dtype: two ``sumproduct_pair``
    contractions (float32 accumulation, each result rounded), first over the
    summed dims where ``i3`` is expanded, then the rest; a summed unroll dim
    accumulates slice by slice in the half dtype."""
    dtype = x.dtype
    dims12 = tuple(i for i in sorted(sumdim) if i != unroll_dim and i in expand3)
    dims23 = tuple(i for i in sorted(sumdim) if i != unroll_dim and i not in expand3)
    f32 = jnp.float32
    buf = jnp.sum(x.astype(f32) * y.astype(f32), axis=dims12, keepdims=True).astype(dtype)
    buf = lax.optimization_barrier(buf)
    buf = jnp.sum(buf.astype(f32) * z.astype(f32), axis=dims23, keepdims=True).astype(dtype)
    buf = lax.optimization_barrier(buf)
    if unroll_dim in sumdim:
        slices = jnp.moveaxis(buf, unroll_dim, 0)

        def add(acc, piece):
            acc = lax.optimization_barrier((acc.astype(f32) + piece.astype(f32)).astype(dtype))
            return acc, None

        acc, _ = lax.scan(add, jnp.zeros(slices.shape[1:], dtype), slices)
        buf = jnp.expand_dims(acc, unroll_dim)
    return jnp.squeeze(buf, axis=tuple(sumdim)) if sumdim else buf


@lowering(aten._grouped_mm.default)
def grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """``torch._grouped_mm`` (MoE experts): ``offs`` holds each group's end along
    the ragged dim, the rows of a 2-d ``a`` (one matrix of ``b`` per group), the
    contracted dim (two 2-d operands: one product per group, as its backward
    computes the weights' gradient), or the columns of a 2-d ``b``. Rows or
    columns past the last end are zeros (CPU leaves them unwritten)."""
    dtype = a.dtype
    accumulate = jnp.float32 if dtype in (jnp.bfloat16, jnp.float16) else None
    if offs is None:  # 3-d by 3-d: a batch of products
        return jnp.matmul(a, b, preferred_element_type=accumulate).astype(dtype)
    sizes = jnp.diff(offs.astype(jnp.int32), prepend=0)
    if a.ndim == 2 and b.ndim == 3:
        out = lax.ragged_dot(a, b, sizes, preferred_element_type=accumulate)
    elif a.ndim == 3 and b.ndim == 2:
        out = lax.ragged_dot(b.T, jnp.swapaxes(a, 1, 2), sizes, preferred_element_type=accumulate).T
    else:
        numbers = lax.RaggedDotDimensionNumbers(
            dot_dimension_numbers=(([1], [0]), ([], [])), lhs_ragged_dimensions=[1], rhs_group_dimensions=[]
        )
        out = lax.ragged_dot_general(a, b, sizes, numbers, preferred_element_type=accumulate)
    return out.astype(dtype)
