"""Matrix products (mm, bmm, mv, dot and their ``add*`` forms) and triangles.

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
    """Element-wise in the input dtype, as torch's CPU kernel:
    ``beta * self + (alpha * x_i) * y_j`` with the scalars in that dtype."""
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
