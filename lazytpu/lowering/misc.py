"""Ops outside the other families: complex-number builders and pairwise
distances.

``view_as_real``/``view_as_complex`` are views in torch whose dtype differs
from their base's, so the dispatcher computes them as values (they share no
storage here: writing through one does not reach the base).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax import lax

from lazytpu.lowering.linalg_ext import p_norm
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


# -- complex numbers -----------------------------------------------------------


@lowering(aten.view_as_real.default)
def view_as_real(z):
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1)


@lowering(aten.view_as_complex.default)
def view_as_complex(x):
    return lax.complex(x[..., 0], x[..., 1])


@lowering(aten.complex.default)
def complex_(real, imag):
    real, imag = jnp.broadcast_arrays(real, imag)
    return lax.complex(real, imag)


@lowering(aten.polar.default)
def polar(magnitude, angle):
    magnitude, angle = jnp.broadcast_arrays(magnitude, angle)
    return lax.complex(magnitude * jnp.cos(angle), magnitude * jnp.sin(angle))


# -- pairwise distances ----------------------------------------------------------


def _pdist(x, p):
    """Distances between rows ``i < j`` of ``x`` (row-major over the pairs)."""
    n = x.shape[0]
    rows, cols = jnp.triu_indices(n, k=1)
    return p_norm(jnp.abs(x[rows] - x[cols]), p, (1,), False)


@lowering(aten._pdist_forward.default)
def pdist(x, p=2.0):
    return _pdist(x, p)


@lowering(aten._pdist_backward.default)
def pdist_backward(grad, x, p, distances):
    _, pullback = jax.vjp(lambda v: _pdist(v, p), x)
    return pullback(grad)[0]
