"""Factories and conversions: empty, full, arange, _to_copy, clone."""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazytpu import _dtypes
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _jdtype(dtype):
    return _dtypes.to_jax(dtype if dtype is not None else torch.get_default_dtype())


@lowering(aten.empty.memory_format)
def empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    # Uninitialized memory in torch; zeros here (deterministic, and usually dead).
    return jnp.zeros(tuple(size), _jdtype(dtype))


@lowering(aten.empty_strided)
def empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.zeros(tuple(size), _jdtype(dtype))


@lowering(aten._to_copy)
def to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False, memory_format=None):
    return x if dtype is None else x.astype(_dtypes.to_jax(dtype))


@lowering(aten.clone)
def clone(x, *, memory_format=None):
    return x
