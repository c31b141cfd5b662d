"""Reductions."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


@lowering(aten.sum.default)
def sum_(x, *, dtype=None):
    return jnp.sum(x)
