"""Powers, as CPU torch computes them: ``pow`` of every dtype and form.

CPU's kernel has special cases that this rule keeps, since they round
differently from a general ``pow``: ``x * x`` for 2, ``x * x * x`` for 3,
``1 / (x * x)`` for -2, ``sqrt``/``rsqrt`` for 0.5/-0.5 (a scalar exponent);
float16 computes in float32 and rounds once, bfloat16 rounds each product;
integer powers are exact and wrap (torch's ``powi``); see also Note
[Scalars of half operands] in lazytpu.lowering.elementwise.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from lazytpu.lowering.elementwise import NUMBER, Kind, promote, rsqrt, sqrt
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _int_pow(a, b):
    # torch's powi: exact integer powers, wrapping; negative exponents give
    # 1, +-1 or 0 (c10/util/generic_math.h).
    acc, base, e = jnp.ones_like(a), a, jnp.where(b < 0, 0, b)
    for _ in range(8 * a.dtype.itemsize):
        acc = jnp.where(e & 1, acc * base, acc)
        base, e = base * base, e >> 1
    neg = jnp.where(a == 1, 1, jnp.where(a == -1, jnp.where(b & 1, -1, 1), 0)).astype(a.dtype)
    return jnp.where(b < 0, neg, acc)


@lowering(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def pow_(x, y):
    if type(y) is bool:  # CPU's kernel copies for 1 and fills ones for 0, before its dtype check (bool too)
        return x if y else jnp.ones_like(x)
    if type(y) is int and not isinstance(x, NUMBER) and jnp.issubdtype(x.dtype, jnp.inexact):
        if x.dtype == jnp.bfloat16 and y in (3, -2):  # CPU multiplies in bfloat16, rounding each product
            square = x * x
            return square * x if y == 3 else 1 / square
        if x.dtype in (jnp.float16, jnp.bfloat16):  # else computed in float32 and rounded once, as on CPU
            x = x.astype(jnp.float32)
        return lax.integer_pow(x, y)  # x * x for 2, as torch's CPU kernel
    scalar_exponent = isinstance(y, float) or (not isinstance(y, NUMBER) and y.ndim == 0 and y.weak_type)
    unrounded, stored = y, None if isinstance(x, NUMBER) else x.dtype
    x, y = promote(x, y, kind=Kind.BOOL_TO_LONG, rounded=True)
    if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
        return _int_pow(x, y)
    power = _complex_pow(x, y, scalar_exponent) if jnp.issubdtype(x.dtype, jnp.complexfloating) else jnp.power(x, y)
    if not scalar_exponent:
        return power
    # torch's CPU kernel takes sqrt/rsqrt for these (pow(-inf, 0.5) is nan) and multiplies for
    # 2, 3 and -2 (a complex (1+1j) ** 2.0 is 2j exactly)
    square = x * x
    if stored == jnp.bfloat16:  # CPU multiplies bfloat16 in bfloat16, rounding each product
        square = square.astype(stored).astype(x.dtype)
    power = jnp.where(unrounded == -2, 1 / square, jnp.where(unrounded == 3, square * x, power))
    power = jnp.where(unrounded == 2, x * x, power)
    return jnp.where(unrounded == 0.5, sqrt(x), jnp.where(unrounded == -0.5, rsqrt(x), power))


def _complex_pow(x, y, scalar_exponent: bool):
    """``x ** y`` for complex values. ``0 ** y`` is 0 for ``Re(y) > 0`` on CPU (XLA
    gives nan); CPU's tensor-exponent kernel, ``exp(y * log(x))``, gives
    ``inf+nanj`` for ``Re(y) < 0`` and ``nan+nanj`` otherwise."""
    power = jnp.power(x, y)
    zero = x == 0
    real = jnp.real(y)
    if not scalar_exponent:
        nan = jnp.asarray(jnp.nan, real.dtype)
        invalid = lax.complex(jnp.where(real < 0, jnp.asarray(jnp.inf, real.dtype), nan), nan)
        power = jnp.where(zero, invalid.astype(power.dtype), power)
    return jnp.where(zero & (real > 0), jnp.zeros_like(power), power)
