"""torch dtype <-> JAX/numpy dtype mapping, shared by every stage."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import torch

_TORCH_TO_JAX = {
    torch.float32: jnp.float32,
    torch.float64: jnp.float64,
    torch.float16: jnp.float16,
    torch.bfloat16: jnp.bfloat16,
    torch.int64: jnp.int64,
    torch.int32: jnp.int32,
    torch.int16: jnp.int16,
    torch.int8: jnp.int8,
    torch.uint8: jnp.uint8,
    torch.uint16: jnp.uint16,
    torch.uint32: jnp.uint32,
    torch.uint64: jnp.uint64,
    torch.bool: jnp.bool_,
    torch.complex64: jnp.complex64,
    torch.complex128: jnp.complex128,
}
_JAX_TO_TORCH = {np.dtype(v): k for k, v in _TORCH_TO_JAX.items()}
# JAX has no complex32: it lives on device as complex64 whose parts are
# float16 values (Note [complex32 storage]); reading it back narrows it again.
_TORCH_TO_JAX[torch.complex32] = jnp.complex64


def to_jax(dtype: torch.dtype):
    """The JAX dtype that stores a torch dtype."""
    try:
        return _TORCH_TO_JAX[dtype]
    except KeyError:
        raise TypeError(f"lazytpu: dtype {dtype} is not supported on tpu") from None


def to_torch(dtype) -> torch.dtype:
    """The torch dtype of a JAX/numpy dtype."""
    return _JAX_TO_TORCH[np.dtype(dtype)]


def itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


# Note [complex32 storage]
# ~~~~~~~~~~~~~~~~~~~~~~~~
# torch.complex32 (chalf) has no JAX dtype. A complex32 value is stored as a
# complex64 array whose real and imaginary parts are exactly representable in
# float16: ``program.cast_to`` rounds each part through float16 whenever a rule
# produces a complex32 result, as CPU torch rounds when it stores a chalf
# element, and ``hostio`` widens on upload and narrows on download (both exact).


def round_complex32(x):
    """Round the parts of a complex64 array to float16 values (still complex64)."""
    re = jnp.real(x).astype(jnp.float16).astype(jnp.float32)
    im = jnp.imag(x).astype(jnp.float16).astype(jnp.float32)
    return jax.lax.complex(re, im)
