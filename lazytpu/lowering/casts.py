"""Dtype conversion as CPU torch converts: the one cast every lowering uses.

Note [Float to integer casts]: XLA converts a float to an integer by
saturating (NaN -> 0, 1e20 -> INT_MAX); CPU torch (x86_64) truncates with
the CPU's own instruction (``cvttss2si``/``cvttsd2si`` and their vector
forms), which gives the "integer indefinite" value, INT_MIN of the width it
converts to, for NaN, +-inf and anything out of range. Measured on torch
2.13, the same with ATEN_CPU_CAPABILITY=avx512, avx2 and default, for
tensors of 1, 15 and 4096 elements (scalar and vectorized loops agree):

- int32 and int64 targets: ``trunc(x)`` when ``-2**(b-1) <= x < 2**(b-1)``,
  else ``-2**(b-1)`` (int32 of NaN, 1e20, -1e20 -> -2**31);
- int8, int16 and uint16 go through int32, then keep the low bits (two's
  complement wrap): float32 70000 -> int16 4464, NaN -> 0;
- uint8 goes through int64 (c10's ``static_cast_with_inter_type<uint8_t>``),
  then keeps the low byte: -1 -> 255, 300 -> 44, float64 2**32 + 5 -> 5;
- float16 and bfloat16 behave as their (exact) float32 values;
- complex: the real part, as above (the imaginary part is discarded);
- bool: ``x != 0``, so NaN is True; a subnormal is True as well, which
  XLA's convert (and ``x != 0``) miss where the platform treats subnormal
  inputs as zero (XLA:CPU, TPUs), so the rule tests the bits: any bit set
  besides the sign.

The rule is written in XLA ops, so every platform (tpu, gpu, cpu) gives
x86_64 CPU torch's values (not measured on an aarch64 build of torch,
whose conversion instructions saturate).
uint32 and uint64 targets keep XLA's convert: CPU torch's own vectorized
and scalar paths disagree there (float32 NaN -> uint32 is 2**31 in a tensor
of 4096, 0 in a tensor of 1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# target -> the signed width CPU torch converts through (Note [Float to integer casts])
_THROUGH = {
    np.dtype(jnp.int64): np.dtype(jnp.int64),
    np.dtype(jnp.uint8): np.dtype(jnp.int64),
    np.dtype(jnp.int32): np.dtype(jnp.int32),
    np.dtype(jnp.int16): np.dtype(jnp.int32),
    np.dtype(jnp.int8): np.dtype(jnp.int32),
    np.dtype(jnp.uint16): np.dtype(jnp.int32),
}


_E4M3FN = np.dtype(jnp.float8_e4m3fn)
_E4M3FN_MAX = 448.0


def _nonzero_bits(x):
    """``x != 0`` for a real float array, exact for subnormals (Note [Float to integer casts])."""
    bits = jax.lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize])
    magnitude = np.array((1 << (x.dtype.itemsize * 8 - 1)) - 1, bits.dtype)
    return (bits & magnitude) != 0


_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def convert(x, dtype):
    """``x`` (a JAX array) as ``dtype``, with CPU torch's values (Note [Float to integer casts])."""
    target = np.dtype(dtype)
    if target == np.bool_ and jnp.issubdtype(x.dtype, jnp.inexact):
        if jnp.issubdtype(x.dtype, jnp.complexfloating):
            return _nonzero_bits(jnp.real(x)) | _nonzero_bits(jnp.imag(x))
        return _nonzero_bits(x)
    if target == _E4M3FN and x.dtype != target:  # CPU torch saturates (inf -> 448); XLA gives NaN past 464
        if jnp.issubdtype(x.dtype, jnp.complexfloating):
            x = jnp.real(x)
        if x.dtype != jnp.float64:
            x = x.astype(jnp.float32)
        return jnp.clip(x, -_E4M3FN_MAX, _E4M3FN_MAX).astype(target)
    through = _THROUGH.get(target)
    if x.dtype == target or through is None or not jnp.issubdtype(x.dtype, jnp.inexact):
        return x.astype(target)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        x = jnp.real(x)
    if x.dtype.itemsize < 4:
        x = x.astype(jnp.float32)  # exact; float16's inf must not pass as "in range"
    bound = float(2 ** (through.itemsize * 8 - 1))  # a power of two: exact in every float dtype
    inside = (x >= -bound) & (x < bound)  # False for NaN
    wide = jnp.where(inside, x.astype(through), jnp.iinfo(through).min)
    return wide.astype(target)


# Note [Double accumulation]: CPU torch accumulates some float32 kernels in
# double (``at::acc_type<float, /*is_cuda=*/false>``): cumsum, cumprod and
# logcumsumexp, and var and std (its Welford reduction; an all-reduce squares
# deviations from the float32 mean in double). Their results are float32
# roundings of double results, which XLA's float32 scans and sums miss by ulps
# on about half the elements (a float32 cumprod's error grows as sqrt(n): 3e-5
# relative after 1e5 factors, where CPU's is half an ulp). Where float64 is
# native (CPU, GPU) such rules compute in float64 and round; TPUs have no
# float64, and keep float32.
_WIDER = {np.dtype(jnp.float32): jnp.float64, np.dtype(jnp.complex64): jnp.complex128}
_NARROWER = {np.dtype(jnp.float64): jnp.float32, np.dtype(jnp.complex128): jnp.complex64}


def in_double(fn, *args):
    """``fn(*args)``, in float64 (complex128) for float32 (complex64) ``args`` where float64 is
    native, each result rounded back (Note [Double accumulation])."""
    if not any(np.dtype(a.dtype) in _WIDER for a in args):
        return fn(*args)

    def wide(*xs):
        out = fn(*(x.astype(_WIDER[np.dtype(x.dtype)]) if np.dtype(x.dtype) in _WIDER else x for x in xs))
        return jax.tree.map(lambda r: r.astype(_NARROWER.get(np.dtype(r.dtype), r.dtype)), out)

    return jax.lax.platform_dependent(*args, tpu=fn, default=wide)
