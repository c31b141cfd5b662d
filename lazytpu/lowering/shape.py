"""Shape and view ops (as values; aliasing is the dispatcher's business)."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


@lowering(aten.expand)
def expand(x, size, *, implicit=False):
    size = tuple(x.shape[i - (len(size) - x.ndim)] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, size)


@lowering(aten.t)
def t(x):
    return x.T if x.ndim == 2 else x
