"""Elementwise arithmetic, math, comparisons and logic.

Note [Computation dtype]: JAX promotes types differently from torch (int64 +
2.5 is float64 in JAX, float32 in torch; a 0-d tensor loses to a dimensioned
one in torch only). Rules therefore cast their operands with ``promote``,
which asks torch's own ``elementwise_dtypes`` for the dtype torch computes in
(float32 for half types, the "opmath" dtype), so values match CPU torch. The
result is cast to the dtype torch's meta kernel inferred, outside the rule.
Lifted Python scalars arrive as weakly typed JAX scalars and count as Python
numbers here, as they do in torch.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as Kind
from torch._prims_common import elementwise_dtypes

from lazytpu import _dtypes
from lazytpu.lowering import complex_math as cm
from lazytpu.lowering.casts import in_double
from lazytpu.lowering.complex_math import complex_or
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten

NUMBER = (bool, int, float, complex)


def _probe(v):
    """What torch's type promotion sees of a rule argument."""
    if isinstance(v, NUMBER):
        return v
    if v.weak_type and v.ndim == 0:  # a lifted Python scalar (Note [Scalar lifting])
        if jnp.issubdtype(v.dtype, jnp.complexfloating):
            return 1j
        return 1.0 if jnp.issubdtype(v.dtype, jnp.floating) else (True if v.dtype == jnp.bool_ else 1)
    return torch.empty(v.shape, dtype=_dtypes.to_torch(v.dtype), device="meta")


def promote(*xs, kind=Kind.DEFAULT, rounded: bool = False) -> tuple:
    """``xs`` cast to the dtype torch computes in (Note [Computation dtype]).

    ``None`` entries (absent optional operands) stay ``None``. ``rounded``:
    see Note [Scalars of half operands].
    """
    probes = [_probe(x) for x in xs if x is not None]
    compute, common = elementwise_dtypes(*probes, type_promotion_kind=kind)
    default = _dtypes.default_float()
    if default is not torch.get_default_dtype() and (compute.is_floating_point or compute.is_complex):
        compute = _from_default(compute, default, probes)
    dtype = _dtypes.to_jax(compute)
    if rounded and common in _REDUCED and compute is not common:
        narrow = _dtypes.to_jax(common)
        xs = tuple(x if x is None or _has_dtype(x, narrow) else _dtypes.number(x, narrow) for x in xs)
    return tuple(None if x is None else _dtypes.number(x, dtype) for x in xs)


# Note [Scalars of half operands]: CPU torch's TensorIterator casts every
# operand to the op's common dtype before the kernel computes in float32: a
# Python number or a 0-d tensor meeting a float16/bfloat16 tensor is rounded
# to half first (``half + 2.3`` adds 2.30078125, ``fmod(half, 0.1)`` divides
# by 0.0999755859375), in add, sub, fmod, remainder, pow, atan2, xlogy and
# the comparisons (xlogy also rounds its log to half before the product).
# mul, div, floor_divide, lerp and addcmul read the number unrounded (their
# kernels' ``original_scalar_value``); so do their rules.
_REDUCED = (torch.float16, torch.bfloat16)


def _has_dtype(x, dtype) -> bool:
    return not isinstance(x, NUMBER) and x.dtype == dtype


def _from_default(compute: torch.dtype, default: torch.dtype, probes: list) -> torch.dtype:
    """``compute`` as torch would have chosen it under the op's default dtype,
    not torch's now (Note [Default dtype in programs] in lazytpu._dtypes):
    it came from the default when no operand is a float or complex tensor."""
    if any(isinstance(p, torch.Tensor) and (p.is_floating_point() or p.is_complex()) for p in probes):
        return compute
    if compute.is_complex:
        return torch.complex128 if default is torch.float64 else torch.complex64
    return default if default in (torch.float32, torch.float64) else torch.float32  # half types compute in float32


def _is_int(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_


def _is_bool(x) -> bool:
    return not isinstance(x, NUMBER) and x.dtype == jnp.bool_


def common_dtype(*xs, kind=Kind.DEFAULT) -> torch.dtype:
    """The dtype torch casts the operands ``xs`` to (its result dtype for ``kind``)."""
    return elementwise_dtypes(*(_probe(x) for x in xs), type_promotion_kind=kind)[1]


def _rounded_alpha(alpha, x, y):
    """``alpha`` rounded to a float16/bfloat16 common dtype (Note [Scalars of half operands])."""
    if type(alpha) in (bool, int) and alpha == 1:
        return alpha
    common = common_dtype(x, y)
    return _dtypes.number(alpha, _dtypes.to_jax(common)) if common in _REDUCED else alpha


def _scaled(y, alpha):
    if type(alpha) in (bool, int) and alpha == 1:
        return y
    return y * _dtypes.number(alpha, y.dtype)


# -- arithmetic ------------------------------------------------------------------


@lowering(aten.add.Tensor, aten.add.Scalar)
def add(x, y, *, alpha=1):
    alpha = _rounded_alpha(alpha, x, y)
    x, y = promote(x, y, rounded=True)
    return x + _scaled(y, alpha)


@lowering(aten.sub.Tensor, aten.sub.Scalar)
def sub(x, y, *, alpha=1):
    alpha = _rounded_alpha(alpha, x, y)
    x, y = promote(x, y, rounded=True)
    return x - _scaled(y, alpha)


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(x, y, *, alpha=1):
    alpha = _rounded_alpha(alpha, x, y)
    x, y = promote(x, y, rounded=True)
    return y - _scaled(x, alpha)


@lowering(aten.mul.Tensor, aten.mul.Scalar)
def mul(x, y):
    x_mask, y_mask = _is_bool(x), _is_bool(y)
    if x_mask != y_mask:
        # XLA rewrites a * convert(pred) to select(pred, a, 0); torch keeps inf * False == nan
        mask, other = (x, y) if x_mask else (y, x)
        (other,) = promote(other, mask)[:1]
        return jnp.where(mask, other, other * 0)
    x, y = promote(x, y)
    return x * y


@lowering(aten.div.Tensor, aten.div.Scalar)
def div(x, y):
    x, y = promote(x, y, kind=Kind.INT_TO_FLOAT)
    if jnp.iscomplexobj(x):  # Note [Complex special values] in lowering/complex_math
        return cm.divide(x, y)
    return true_divide(x, y)


# Note [Exact quotients]: XLA rewrites a division by a broadcast or constant
# divisor into a multiplication by its reciprocal, an ulp off the correctly
# rounded quotient at times (21 / 7 -> 3.0000002). Float32 true division divides
# in float64 where it is native (``in_double``), whose rounding is CPU's quotient
# (a TPU keeps the rewrite, as CUDA torch's scalar kernel does). Float64 (a third
# of its quotients by a broadcast or expanded divisor were an ulp off) and rounding
# modes, where an ulp becomes a unit, divide behind an optimization barrier.


def true_divide(x, y):
    """``x / y`` of real floats, rounded as CPU torch's quotient (Note [Exact quotients])."""
    return divide_exactly(x, y) if x.dtype == jnp.float64 else in_double(jnp.divide, x, y)


def divide_exactly(x, y):
    return x / lax.optimization_barrier(jnp.broadcast_to(y, jnp.broadcast_shapes(x.shape, y.shape)))


def _floor_divide(x, y):
    if _is_int(x):
        return jnp.floor_divide(x, y)
    # torch's div_floor_floating (c10/util/generic_math.h)
    mod = jnp.fmod(x, y)
    quot = divide_exactly(x - mod, y)
    quot = jnp.where((mod != 0) & ((y < 0) != (mod < 0)), quot - 1, quot)
    floor = jnp.floor(quot)
    floor = jnp.where(quot - floor > 0.5, floor + 1, floor)
    true_quot = divide_exactly(x, y)
    floor = jnp.where(quot == 0, jnp.copysign(jnp.zeros_like(quot), true_quot), floor)
    return jnp.where(y == 0, true_quot, floor)


def _trunc_divide(x, y):
    if _is_int(x):
        return lax.div(*jnp.broadcast_arrays(x, y))
    return jnp.trunc(divide_exactly(x, y))


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(x, y, *, rounding_mode=None):
    if rounding_mode is None:
        return div(x, y)
    x, y = promote(x, y)
    return (_floor_divide if rounding_mode == "floor" else _trunc_divide)(x, y)


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(x, y):
    return _floor_divide(*promote(x, y))


@lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(x, y):
    x, y = promote(x, y, rounded=True)
    mod = jnp.fmod(x, y)
    return jnp.where((mod != 0) & ((y < 0) != (mod < 0)), mod + y, mod)


@lowering(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(x, y):
    return jnp.fmod(*promote(x, y, rounded=True))  # C's fmod: the sign of x


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(x, end, weight):
    x, end, weight = promote(x, end, weight)
    diff = end - x
    return jnp.where(jnp.abs(weight) < 0.5, x + weight * diff, end - diff * (1 - weight))


@lowering(aten.addcmul.default)
def addcmul(x, t1, t2, *, value=1):
    x, t1, t2 = promote(x, t1, t2)
    return x + _scaled(t1, value) * t2


@lowering(aten.addcdiv.default)
def addcdiv(x, t1, t2, *, value=1):
    x, t1, t2 = promote(x, t1, t2)
    return x + (_scaled(t1, value) / t2 if jnp.iscomplexobj(x) else true_divide(_scaled(t1, value), t2))


@lowering(aten.maximum.default)
def maximum(x, y):
    return jnp.maximum(*promote(x, y))


@lowering(aten.minimum.default)
def minimum(x, y):
    return jnp.minimum(*promote(x, y))


@lowering(aten.clamp.default, aten.clamp.Tensor, aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp(x, min=None, max=None):
    x, lo, hi = promote(x, min, max)
    if lo is not None:
        x = jnp.maximum(x, lo)  # NaN in x or a bound propagates, as in torch
    if hi is not None:
        x = jnp.minimum(x, hi)
    return x


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(x, max):
    return clamp(x, None, max)


# -- unary math --------------------------------------------------------------------


def _unary(fn, kind):
    def rule(x):
        (x,) = promote(x, kind=kind)
        return fn(x)

    rule.__qualname__ = rule.__name__ = f"unary_{fn.__name__}"
    return rule


def _sign(x):
    if _is_int(x):
        return x if x.dtype == jnp.bool_ else jnp.sign(x)
    return jnp.where(jnp.isnan(x) | (x == 0), 0, jnp.sign(x))  # torch: sign(nan) == sign(-0.0) == +0.0


def _abs(x):
    if x.dtype == jnp.bool_:
        return x
    if jnp.iscomplexobj(x):  # hypot's rule, as CPU: an infinite part makes it infinite, NaN or not
        return jnp.where(jnp.isinf(x.real) | jnp.isinf(x.imag), jnp.inf, jnp.abs(x)).astype(x.real.dtype)
    return jnp.abs(x)


def _integral_or(fn):
    def rounded(x):
        return x if _is_int(x) else fn(x)

    rounded.__name__ = fn.__name__
    return rounded


def _exp2(x):
    """``2**x`` exact at integers, as CPU's (XLA's ``exp(x * ln 2)`` is 13 ulp
    off in float32: ``exp2(55.)`` was not 2**55): ``2**f * 2**n`` for the
    nearest integer ``n`` and ``|f| <= 1/2``; halves compute in float32."""
    wide = x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x
    finite = jnp.isfinite(wide)
    n = jnp.where(finite, jnp.clip(jnp.round(wide), -2000, 2000), 0)
    power = jnp.ldexp(jnp.exp((wide - n) * math.log(2)), n.astype(jnp.int32))
    return jnp.where(finite, power, jnp.exp2(wide)).astype(x.dtype)


# Note [Square roots on XLA:CPU]: XLA rewrites ``a / sqrt(b)`` as ``a * rsqrt(b)``, and
# XLA:CPU's ``rsqrt`` is not CPU torch's ``1 / sqrt`` rounded twice: 36-40% of float32 and
# float64 results were an ulp off (``x / x.norm()``, RMSNorm, the norms' inverse deviation).
# On XLA:CPU a square root passes an optimization barrier, which the rewrite does not see
# through, and ``rsqrt`` divides 1 by it; other platforms keep XLA's forms and fusion.


def sqrt(x):
    """``jnp.sqrt(x)``, which a division divides by (Note [Square roots on XLA:CPU])."""
    return lax.platform_dependent(x, cpu=lambda v: lax.optimization_barrier(jnp.sqrt(v)), default=jnp.sqrt)


def rsqrt(x):
    """``1 / sqrt(x)`` rounded twice, as CPU torch's (Note [Square roots on XLA:CPU])."""
    return lax.platform_dependent(x, cpu=lambda v: 1 / lax.optimization_barrier(jnp.sqrt(v)), default=lax.rsqrt)


def _sigmoid(x):
    return 1 / (1 + jnp.exp(-x))  # torch's CPU formula (no tanh-based cancellation)


# complex operands take complex_math's rules (Note [Complex special values])
_UNARY = {
    # int inputs compute in the default float dtype
    Kind.INT_TO_FLOAT: {
        aten.exp.default: complex_or(jnp.exp, cm.exp),
        aten.exp2.default: complex_or(_exp2, cm.exp2),
        aten.expm1.default: complex_or(jnp.expm1, cm.expm1),
        aten.log.default: complex_or(jnp.log, cm.log),
        aten.log1p.default: complex_or(jnp.log1p, cm.log1p),
        aten.log2.default: complex_or(jnp.log2, cm.log2),
        aten.sqrt.default: complex_or(sqrt, cm.sqrt),
        aten.rsqrt.default: complex_or(rsqrt, cm.rsqrt),
        aten.reciprocal.default: complex_or(jnp.reciprocal, cm.reciprocal),
        aten.sin.default: complex_or(jnp.sin, cm.sin),
        aten.cos.default: complex_or(jnp.cos, cm.cos),
        aten.tanh.default: complex_or(jnp.tanh, cm.tanh),
        aten.sigmoid.default: complex_or(_sigmoid, cm.sigmoid),
        aten.erf.default: lax.erf,
    },
    Kind.DEFAULT: {
        aten.neg.default: jnp.negative,
        aten.sign.default: _sign,
        aten.sgn.default: complex_or(_sign, cm.sgn),
        aten.floor.default: _integral_or(jnp.floor),
        aten.ceil.default: _integral_or(jnp.ceil),
        aten.trunc.default: _integral_or(jnp.trunc),
        aten.round.default: _integral_or(jnp.round),  # half to even, as nearbyint
        aten.bitwise_not.default: jnp.invert,
        aten.conj_physical.default: jnp.conj,
        aten._conj_physical.default: jnp.conj,
    },
    Kind.COMPLEX_TO_FLOAT: {aten.abs.default: _abs},
}
for _kind, _table in _UNARY.items():
    for _op, _fn in _table.items():
        lowering(_op)(_unary(_fn, _kind))


@lowering(aten.round.decimals)
def round_decimals(x, *, decimals=0):
    if _is_int(x):
        return x
    (x,) = promote(x)
    try:
        scale = 10.0 ** abs(decimals)
    except OverflowError:
        scale = math.inf  # as CPU's std::pow overflows
    if decimals < 0:
        return jnp.round(x / scale) * scale
    return jnp.round(x * scale) / scale


@lowering(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    if _is_int(x):
        return x
    info = jnp.finfo(x.dtype)
    x = jnp.where(jnp.isnan(x), 0.0 if nan is None else nan, x)
    x = jnp.where(x == jnp.inf, info.max if posinf is None else posinf, x)
    return jnp.where(x == -jnp.inf, info.min if neginf is None else neginf, x)


# -- predicates ----------------------------------------------------------------------


for _op, _fn in {
    aten.isnan.default: jnp.isnan,
    aten.isinf.default: jnp.isinf,
    aten.isfinite.default: jnp.isfinite,
    aten.isposinf.default: jnp.isposinf,
    aten.isneginf.default: jnp.isneginf,
}.items():
    lowering(_op)(_fn)


@lowering(aten.signbit.default)
def signbit(x):
    return x < 0 if _is_int(x) else jnp.signbit(x)


# -- comparisons and logic -------------------------------------------------------------


def _compare(fn):
    def rule(x, y):
        return fn(*promote(x, y, rounded=True))

    rule.__qualname__ = rule.__name__ = f"compare_{fn.__name__}"
    return rule


for _name, _fn in {
    "eq": jnp.equal,
    "ne": jnp.not_equal,
    "lt": jnp.less,
    "le": jnp.less_equal,
    "gt": jnp.greater,
    "ge": jnp.greater_equal,
    "bitwise_and": jnp.bitwise_and,
    "bitwise_or": jnp.bitwise_or,
    "bitwise_xor": jnp.bitwise_xor,
}.items():
    _packet = getattr(aten, _name)
    _overloads = ("Tensor", "Scalar", "Scalar_Tensor") if _name.startswith("bitwise") else ("Tensor", "Scalar")
    lowering(*(getattr(_packet, o) for o in _overloads))(_compare(_fn))


@lowering(aten.logical_not.default)
def logical_not(x):
    return x == 0


@lowering(aten.logical_and.default)
def logical_and(x, y):
    return (x != 0) & (y != 0)


@lowering(aten.logical_or.default)
def logical_or(x, y):
    return (x != 0) | (y != 0)


@lowering(aten.logical_xor.default)
def logical_xor(x, y):
    return (x != 0) ^ (y != 0)


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(condition, x, y):
    x, y = promote(x, y)
    return jnp.where(condition.astype(jnp.bool_), x, y)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(x, mask, value):
    return jnp.where(mask, _dtypes.number(value, x.dtype), x)


# -- activations and their backward ops ----------------------------------------------


@lowering(aten.relu.default)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))  # NaN stays NaN


@lowering(aten.threshold.default)
def threshold(x, threshold, value):
    # the CPU kernel compares in x's dtype
    return jnp.where(x <= _dtypes.number(threshold, x.dtype), _dtypes.number(value, x.dtype), x)


@lowering(aten.threshold_backward.default)
def threshold_backward(grad, x, threshold):
    grad, x = promote(grad, x)
    return jnp.where(x <= threshold, jnp.zeros((), grad.dtype), grad)


@lowering(aten.sigmoid_backward.default)
def sigmoid_backward(grad, y):
    grad, y = promote(grad, y)
    return grad * jnp.conj((1 - y) * y)  # the conjugate for complex, as torch's kernel


@lowering(aten.tanh_backward.default)
def tanh_backward(grad, y):
    grad, y = promote(grad, y)
    return grad * jnp.conj(1 - y * y)


_SQRT1_2 = 0.70710678118654752440
_2_SQRTPI = 1.12837916709551257390
_TANH_BETA = 2**0.5 * _2_SQRTPI * 0.5
_TANH_KAPPA = 0.044715


@lowering(aten.gelu.default)
def gelu(x, *, approximate="none"):
    (x,) = promote(x)
    if approximate == "tanh":
        return 0.5 * x * (1 + jnp.tanh(_TANH_BETA * (x + _TANH_KAPPA * x * x * x)))
    return x * 0.5 * (1 + lax.erf(x * _SQRT1_2))


@lowering(aten.gelu_backward.default)
def gelu_backward(grad, x, *, approximate="none"):
    grad, x = promote(grad, x)
    if approximate == "tanh":
        x_sq = x * x
        tanh_inner = jnp.tanh(_TANH_BETA * (x + _TANH_KAPPA * x_sq * x))
        right = 0.5 * x * (1 - tanh_inner * tanh_inner) * (_TANH_BETA * (1 + 3 * _TANH_KAPPA * x_sq))
        return grad * (0.5 * (1 + tanh_inner) + right)
    cdf = 0.5 * (1 + lax.erf(x * _SQRT1_2))
    pdf = (_2_SQRTPI * _SQRT1_2 * 0.5) * jnp.exp(x * x * -0.5)
    return grad * (cdf + x * pdf)


@lowering(aten.silu.default)
def silu(x):
    (x,) = promote(x)
    return x / (1 + jnp.exp(-x))


@lowering(aten.silu_backward.default)
def silu_backward(grad, x):
    grad, x = promote(grad, x)
    s = _sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@lowering(aten.softplus.default)
def softplus(x, beta=1, threshold=20):
    (x,) = promote(x)
    z = x * beta
    return jnp.where(z > threshold, x, jnp.log1p(jnp.exp(z)) / beta)


@lowering(aten.softplus_backward.default)
def softplus_backward(grad, x, beta, threshold):
    grad, x = promote(grad, x)
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, grad, grad * z / (z + 1))


@lowering(aten.leaky_relu.default)
def leaky_relu(x, negative_slope=0.01):
    (x,) = promote(x)
    return jnp.where(x > 0, x, x * negative_slope)


@lowering(aten.leaky_relu_backward.default)
def leaky_relu_backward(grad, x, negative_slope, self_is_result):
    grad, x = promote(grad, x)
    return jnp.where(x > 0, grad, grad * negative_slope)


@lowering(aten.elu.default)
def elu(x, alpha=1, scale=1, input_scale=1):
    (x,) = promote(x)
    return jnp.where(x <= 0, jnp.expm1(x * input_scale) * (alpha * scale), x * scale)


@lowering(aten.elu_backward.default)
def elu_backward(grad, alpha, scale, input_scale, is_result, self_or_result):
    grad, y = promote(grad, self_or_result)
    if is_result:
        neg = grad * input_scale * (y + alpha * scale)
    else:
        neg = grad * input_scale * (alpha * scale) * jnp.exp(y * input_scale)
    return jnp.where(y <= 0, neg, grad * scale)


@lowering(aten.hardtanh.default)
def hardtanh(x, min_val=-1, max_val=1):
    return clamp(x, min_val, max_val)


@lowering(aten.hardtanh_backward.default)
def hardtanh_backward(grad, x, min_val, max_val):
    grad, x = promote(grad, x)
    return jnp.where((x <= min_val) | (x >= max_val), jnp.zeros((), grad.dtype), grad)
