"""Norms: ``norm``, ``dist``, ``renorm``, and ``p_norm``, which the pairwise
distances and weight norms of other families share."""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from lazytpu import _dtypes
from lazytpu.lowering.elementwise import sqrt
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def p_norm(a, p, ax, keepdim: bool):
    """The ``p``-norm of ``|x|`` values ``a`` over ``ax``, for a static or a
    traced ``p`` (a traced one picks its formula with ``lax.switch``: only the
    chosen branch runs)."""
    branches = (
        lambda a: jnp.max(a, axis=ax, keepdims=keepdim, initial=0),
        lambda a: jnp.min(a, axis=ax, keepdims=keepdim, initial=jnp.inf),
        lambda a: jnp.sum((a != 0).astype(a.dtype), axis=ax, keepdims=keepdim),
        lambda a: jnp.sum(a, axis=ax, keepdims=keepdim),
        lambda a: sqrt(jnp.sum(a * a, axis=ax, keepdims=keepdim)),
        lambda a: jnp.sum(a ** jnp.asarray(p, a.dtype), axis=ax, keepdims=keepdim) ** (1 / jnp.asarray(p, a.dtype)),
    )
    if isinstance(p, (int, float)):
        index = {float("inf"): 0, float("-inf"): 1, 0: 2, 1: 3, 2: 4}.get(p, 5)
        return branches[index](a)
    index = jnp.select([p == jnp.inf, p == -jnp.inf, p == 0, p == 1, p == 2], list(range(5)), 5)
    return lax.switch(index, branches, a)


def _norm_acc(x, dtype):
    if dtype is not None:
        x = x.astype(_dtypes.to_jax(dtype))
    elif x.dtype in (jnp.float16, jnp.bfloat16):
        x = x.astype(jnp.float32)
    return jnp.abs(x)


def _norm_axes(x, dim) -> tuple:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(x.ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(sorted({d % max(x.ndim, 1) for d in dims})) if x.ndim else ()


@lowering(aten.norm.Scalar, aten.norm.ScalarOpt_dtype)
def norm(x, p=2, *, dtype=None):
    return p_norm(_norm_acc(x, dtype), 2 if p is None else p, tuple(range(x.ndim)), False)


@lowering(aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dim_dtype)
def norm_dim(x, p, dim, keepdim=False, *, dtype=None):
    return p_norm(_norm_acc(x, dtype), 2 if p is None else p, _norm_axes(x, dim), keepdim)


@lowering(aten.dist.default)
def dist(x, y, p=2):
    return p_norm(_norm_acc(x - y, None), p, tuple(range(max(x.ndim, y.ndim))), False)


@lowering(aten.renorm.default)
def renorm(x, p, dim, maxnorm):
    """Each slice along ``dim`` rescaled to norm at most ``maxnorm``."""
    ax = tuple(d for d in range(x.ndim) if d != dim % x.ndim)
    norms = p_norm(_norm_acc(x, None), p, ax, True)
    factor = jnp.where(norms > maxnorm, maxnorm / (norms + 1e-7), 1.0)
    return x * factor.astype(x.dtype)


@lowering(aten._weight_norm_interface_backward.default)
def weight_norm_backward(grad_w, v, g, norms, dim):
    """CPU's kernel: with ``s`` the sum over each slice along ``dim`` of
    ``grad_w * v``, ``grad_g = s / norm`` and ``grad_v = (g / norm) * grad_w -
    (g / norm) * (grad_g / norm) * v`` (half precision accumulates in float32)."""
    acc = jnp.float32 if v.dtype in (jnp.float16, jnp.bfloat16) else v.dtype
    grad_w, v32, g32, norms = (t.astype(acc) for t in (grad_w, v, g, norms))
    ax = tuple(d for d in range(v.ndim) if d != dim % v.ndim)
    grad_g = jnp.sum(grad_w * v32, axis=ax, keepdims=True) / norms
    a = g32 / norms
    b = a * grad_g / norms
    return (a * grad_w - b * v32).astype(v.dtype), grad_g.astype(g.dtype)
