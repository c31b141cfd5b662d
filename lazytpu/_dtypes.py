"""torch dtype <-> JAX/numpy dtype mapping, shared by every stage."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator

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
    torch.float8_e4m3fn: jnp.float8_e4m3fn,
    torch.float8_e5m2: jnp.float8_e5m2,
    torch.float8_e4m3fnuz: jnp.float8_e4m3fnuz,
    torch.float8_e5m2fnuz: jnp.float8_e5m2fnuz,
}
_JAX_TO_TORCH = {np.dtype(v): k for k, v in _TORCH_TO_JAX.items()}
# JAX has no complex32: it lives on device as complex64 whose parts are
# float16 values (Note [complex32 storage]); reading it back narrows it again.
_TORCH_TO_JAX[torch.complex32] = jnp.complex64


# Note [Default dtype in programs]: torch.get_default_dtype() decides the
# float dtype of some results (int / int, int * 0.5, sqrt of an int, a
# factory without a dtype). A program is lowered later than its ops were
# recorded, when the default may have changed back: a value recorded under
# float64 and read after ``torch.set_default_dtype(torch.float32)`` was
# computed in float32 and labelled float64. An op recorded under another
# default than float32 carries it in its template (``DEFAULT_KWARG``, so it
# is part of the program's key too); lowering runs its rule under
# ``lowering_default`` and the rules ask ``default_float()``, never torch.
def supported() -> set[torch.dtype]:
    """The dtypes a tpu tensor can have (``complex32`` is stored as ``complex64``)."""
    return set(_TORCH_TO_JAX)


DEFAULT_KWARG = "__default_dtype__"
_LOWERING = threading.local()


def default_float() -> torch.dtype:
    """The default float dtype of the op being lowered (Note [Default dtype in programs])."""
    return getattr(_LOWERING, "dtype", torch.float32)


@contextlib.contextmanager
def lowering_default(dtype: torch.dtype) -> Iterator[None]:
    old = default_float()
    _LOWERING.dtype = dtype
    try:
        yield
    finally:
        _LOWERING.dtype = old


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


def number(value, dtype):
    """A Python number as a 0-d array of the JAX ``dtype``, converted as
    torch's C++ casts convert it (Note [Python integers wrap]).

    Note [Python integers wrap]: torch turns a Python int into an int64 (or,
    past int64, uint64) scalar, and an op computing in a narrower integer
    dtype casts it there modulo 2**bits: ``uint8 + 300`` adds 44 and
    ``int32 + 2**33`` adds 0. ``jnp.asarray`` raises instead, which would fail
    the whole deferred program. The ops whose C++ kernels convert their
    scalar with an overflow check (``fill_``, ``full``, ``masked_fill``,
    ``clamp``'s bounds, ``alpha``, ...) raise torch's own error at the call:
    dispatch runs such a call on CPU stand-ins first (``lazytpu.frontend.checks.scalars``):
    once per call signature, and at every call for a number lifted to a
    program input (Note [Scalar lifting]) whose value is out of the range of
    the op's dtype (``half.fill_(1e6)``) or an integer divisor that wraps to 0.
    """
    if type(value) is int and jnp.issubdtype(dtype, jnp.integer):
        bits = jnp.iinfo(dtype).bits
        value &= (1 << bits) - 1
        if jnp.issubdtype(dtype, jnp.signedinteger) and value >> (bits - 1):
            value -= 1 << bits
    return jnp.asarray(value, dtype)


# Note [complex32 storage]: torch.complex32 (chalf) has no JAX dtype. A
# complex32 value is stored as a complex64 array whose real and imaginary parts
# are exactly representable in float16: ``to_jax.cast_to`` rounds each part
# through float16 whenever a rule produces a complex32 result, as CPU torch
# rounds when it stores a chalf element, and ``hostio`` widens on upload and
# narrows on download (both exact).


def round_complex32(x):
    """Round the parts of a complex64 array to float16 values (still complex64)."""
    re = jnp.real(x).astype(jnp.float16).astype(jnp.float32)
    im = jnp.imag(x).astype(jnp.float16).astype(jnp.float32)
    return jax.lax.complex(re, im)


@functools.cache
def type_name(dtype: torch.dtype) -> str:
    """torch's C++ name of ``dtype`` (``Float``, ``ComplexDouble``) as its error messages spell it."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")
