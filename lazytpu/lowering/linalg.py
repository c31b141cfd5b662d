"""Matrix products (mm, bmm, mv, dot and their ``add*`` forms) and triangles.

``matmul`` and ``linear`` are CompositeImplicit in torch: they arrive here
already decomposed into these ops plus views.

Note [Scaled adds]: ``addmm`` and friends compute ``beta * self + alpha *
(a @ b)``; when ``beta`` is zero torch ignores ``self`` entirely (NaN and inf
in it do not propagate), so the rule selects instead of multiplying.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _scaled_add(bias, product, beta, alpha):
    """``beta * bias + alpha * product`` (Note [Scaled adds])."""
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


@lowering(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)
def addmm(bias, x, y, *, beta=1, alpha=1):
    return _scaled_add(bias, jnp.matmul(x, y), beta, alpha)


@lowering(aten.addbmm.default)
def addbmm(bias, x, y, *, beta=1, alpha=1):
    return _scaled_add(bias, jnp.einsum("bij,bjk->ik", x, y), beta, alpha)


@lowering(aten.addr.default)
def addr(bias, x, y, *, beta=1, alpha=1):
    return _scaled_add(bias, jnp.outer(x, y), beta, alpha)


@lowering(aten.tril)
def tril(x, diagonal=0):
    return jnp.tril(x, diagonal)


@lowering(aten.triu)
def triu(x, diagonal=0):
    return jnp.triu(x, diagonal)
