"""Matrix products."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


@lowering(aten.mm)
def mm(x, y):
    return jnp.matmul(x, y)
