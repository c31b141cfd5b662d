"""Random ops: each takes an explicit ``key`` (the device's PRNG state)."""

from __future__ import annotations

import jax
import torch

from lazytpu import _dtypes
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


@lowering(aten.normal_functional, random=True)
def normal(x, mean=0.0, std=1.0, *, generator=None, key):
    noise = jax.random.normal(key, x.shape, _dtypes.to_jax(torch.float32) if x.dtype == jax.numpy.bfloat16 else x.dtype)
    return mean + std * noise
