"""Pointwise math beyond ``elementwise``: inverse trig and hyperbolic
functions, gamma-family and error-function specials, float bit tricks,
integer shifts and gcd, and the shrink/glu/mish activations with their
backward ops.

Rules follow torch's CPU kernels (aten/src/ATen/native/Math.h and
cpu/UnaryOpsKernel.cpp), special values included; where jax.scipy computes
the same function, only the special values torch defines differently are
patched. Operands are cast as in ``elementwise`` (Note [Computation dtype]).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import jax.scipy.special as jss
import torch
from jax import lax

from lazytpu import _dtypes
from lazytpu.lowering import complex_math as cm
from lazytpu.lowering.complex_math import complex_or
from lazytpu.lowering.elementwise import Kind, common_dtype, divide_exactly, elu, promote
from lazytpu.lowering.factories import is_integral, jax_dtype
from lazytpu.lowering.pointwise_ext import modified_bessel_i0
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _float(*xs):
    """``xs`` in the float dtype torch computes a float op in (ints promote)."""
    return promote(*xs, kind=Kind.INT_TO_FLOAT)


def _where_nan(x, y):
    """``y``, but NaN wherever ``x`` is (torch's kernels return a NaN input first)."""
    return jnp.where(jnp.isnan(x), x, y)


def _copysign_inf(sign_of):
    return jnp.copysign(jnp.full_like(sign_of, jnp.inf), sign_of)


# -- unary float functions -------------------------------------------------------


def _angle(x):
    if jnp.iscomplexobj(x):
        return jnp.angle(x)
    return _where_nan(x, jnp.where(x < 0, jnp.asarray(math.pi, x.dtype), jnp.zeros_like(x)))


def _sinc(x):
    product = jnp.asarray(math.pi, x.dtype) * x
    return jnp.where(x == 0, jnp.ones_like(x), jnp.sin(product) / product)


def _entr(x):
    return _where_nan(x, jnp.where(x > 0, -x * jnp.log(x), jnp.where(x == 0, 0.0, -jnp.inf)).astype(x.dtype))


def _log_ndtr(x):
    t = x * jnp.asarray(math.sqrt(0.5), x.dtype)
    left = jnp.log(_erfcx(-t) / 2) - t * t
    return jnp.where(x < -1.0, left, jnp.log1p(-lax.erfc(t) / 2))


def _erfcx(x):
    # jax.scipy's float32 erfcx is 0 on [~9.2, 9.4), where exp(x^2) * erfc(x) underflows before its
    # asymptotic branch starts; five asymptotic terms are exact to float32 from 9 up.
    if x.dtype != jnp.float32:
        return jss.erfcx(x)
    big = jnp.maximum(x, 9.0)
    inv = 1 / (2 * big * big)
    series = 1 - inv * (1 - 3 * inv * (1 - 5 * inv * (1 - 7 * inv * (1 - 9 * inv))))
    return jnp.where(x >= 9, series / (math.sqrt(math.pi) * big), jss.erfcx(x))


def _digamma(x):
    return jnp.where(x == 0, _copysign_inf(-x), jss.digamma(x))


def _trigamma(x):
    # torch's trigamma (Math.h): reflection below 0.5, six recurrence steps, asymptotic tail
    reflect = x < 0.5
    sin_pi_x = jnp.sin(jnp.asarray(math.pi, x.dtype) * x)
    result = jnp.where(reflect, -(math.pi * math.pi) / (sin_pi_x * sin_pi_x), jnp.zeros_like(x))
    x = jnp.where(reflect, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
    return jnp.where(reflect, -result, result)


_ZETA_A = (
    12.0,
    -720.0,
    30240.0,
    -1209600.0,
    47900160.0,
    -1.8924375803183791606e9,
    7.47242496e10,
    -2.950130727918164224e12,
    1.1646782814350067249e14,
    -4.5979787224074726105e15,
    1.8152105401943546773e17,
    -7.1661652561756670113e18,
)
_MACHEP = 1.11022302462515654042e-16


def _zeta(x, q):
    """Hurwitz zeta, torch's Cephes algorithm (Math.h ``zeta``): direct sum
    until the terms vanish or ``q + i > 9``, then Euler-Maclaurin. Computed in
    CPU's accumulation type (float64 for float32: in float32 the series' factors
    overflow where the terms underflow, and zeta(501, 501) was NaN, not 0)."""
    x, q = jnp.broadcast_arrays(x, q)
    if x.dtype == jnp.float32:
        return _zeta(x.astype(jnp.float64), q.astype(jnp.float64)).astype(jnp.float32)

    def summing(state):
        i, a, _, _, done = state
        return ~done & ((i < 9) | (a <= 9))

    def step(state):
        i, a, b, s, done = state
        active = summing(state)
        a_next = a + 1
        b_next = a_next ** (-x)
        s_next = s + b_next
        converged = active & (-_MACHEP * s_next < b_next) & (b_next < _MACHEP * s_next)
        pick = lambda new, old: jnp.where(active, new, old)  # noqa: E731
        return pick(i + 1, i), pick(a_next, a), pick(b_next, b), pick(s_next, s), done | converged

    def more(state):
        return jnp.any(summing(state))

    # torch returns these before summing (below); q = -inf would never reach 9
    early = (x <= 1) | (q <= 0) & ((q == jnp.floor(q)) | (x != jnp.floor(x))) | jnp.isnan(x) | jnp.isnan(q)
    zero = jnp.zeros_like(x)
    state = (jnp.zeros(x.shape, jnp.int32), q, zero, q ** (-x), early)
    _, a, b, s, done = lax.while_loop(more, step, state)
    w = a
    s_tail = jnp.where(done, s, s + b * w / (x - 1) - 0.5 * b)
    a, k = jnp.ones_like(x), zero
    for coefficient in _ZETA_A:
        a = a * (x + k)
        b = b / w
        t = a * b / coefficient
        s_tail = jnp.where(done, s_tail, s_tail + t)
        done = done | (jnp.abs(t / s_tail) < _MACHEP)
        k = k + 1
        a = a * (x + k)
        b = b / w
        k = k + 1
    value = jnp.where(jnp.isnan(x) | jnp.isnan(q), jnp.nan, s_tail)
    value = jnp.where((q <= 0) & (x != jnp.floor(x)), jnp.nan, value)
    value = jnp.where((q <= 0) & (q == jnp.floor(q)), jnp.inf, value)
    value = jnp.where(x < 1, jnp.nan, value)
    return jnp.where(x == 1, jnp.inf, value).astype(x.dtype)


def _polygamma(n: int, x):
    if n == 0:
        return _digamma(x)
    if n == 1:
        return _trigamma(x)
    n, order = ((k + 2**31) % 2**32 - 2**31 for k in (n, n + 1))  # CPU's calc_polygamma: C ints wrap
    sign = 1.0 if n % 2 else -1.0
    try:
        factorial = math.exp(math.lgamma(n + 1.0))
    except (OverflowError, ValueError):
        factorial = math.inf  # as CPU's std::exp overflows, and its std::lgamma of a pole is inf
    return sign * factorial * _zeta(jnp.full_like(x, order), x)


def _erfinv(x):
    return lax.erf_inv(x)


def _frac(x):
    return x - jnp.trunc(x)


def _cosh(x):
    """cosh as CPU torch computes it: ``(exp(|x|) + exp(-|x|)) / 2``, within
    an ulp or two (XLA's is 24 ulp off in float32), and infinite where
    ``exp(|x|)`` is, as on CPU."""
    a = jnp.abs(x)
    return 0.5 * (jnp.exp(a) + jnp.exp(-a))


def _sinh(x):
    """sinh as CPU torch computes it, as ``_cosh``; from ``expm1`` below 1
    (no cancellation near zero; the sign of a zero kept)."""
    a = jnp.abs(x)
    m = jnp.expm1(jnp.minimum(a, 1))
    value = jnp.where(a < 1, 0.5 * (m + m / (m + 1)), 0.5 * (jnp.exp(a) - jnp.exp(-a)))
    return jnp.copysign(value, x)


_UNARY_FLOAT = {
    aten.acos.default: complex_or(jnp.arccos, cm.acos),
    aten.acosh.default: complex_or(jnp.arccosh, cm.acosh),
    aten.asin.default: complex_or(jnp.arcsin, cm.asin),
    aten.asinh.default: complex_or(jnp.arcsinh, cm.asinh),
    aten.atan.default: complex_or(jnp.arctan, cm.atan),
    aten.atanh.default: complex_or(jnp.arctanh, cm.atanh),
    aten.cosh.default: complex_or(_cosh, cm.cosh),
    aten.sinh.default: complex_or(_sinh, cm.sinh),
    aten.tan.default: complex_or(jnp.tan, cm.tan),
    aten.log10.default: complex_or(jnp.log10, cm.log10),
    aten.erfc.default: lax.erfc,
    aten.erfinv.default: _erfinv,
    aten.lgamma.default: lax.lgamma,
    aten.digamma.default: _digamma,
    aten.i0.default: modified_bessel_i0,  # CPU's calc_i0 is the same Cephes series
    aten.sinc.default: _sinc,
    aten.angle.default: _angle,
    aten.deg2rad.default: lambda x: x * jnp.asarray(math.pi / 180, x.dtype),
    aten.rad2deg.default: lambda x: x * jnp.asarray(180 / math.pi, x.dtype),
    aten.special_entr.default: _entr,
    aten.special_erfcx.default: _erfcx,
    aten.special_log_ndtr.default: _log_ndtr,
    aten.special_ndtri.default: jss.ndtri,
    aten.special_i0e.default: jss.i0e,
    aten.special_i1.default: jss.i1,
    aten.special_i1e.default: jss.i1e,
}


def _unary_float(fn):
    def rule(x):
        (x,) = _float(x)
        return fn(x)

    rule.__qualname__ = rule.__name__ = f"special_{getattr(fn, '__name__', 'fn')}"
    return rule


for _op, _fn in _UNARY_FLOAT.items():
    lowering(_op)(_unary_float(_fn))


@lowering(aten.frac.default)
def frac(x):
    (x,) = promote(x)
    return _frac(x)


@lowering(aten.logit.default)
def logit(x, eps=None):
    (x,) = _float(x)
    if eps is not None:
        lo, hi = jnp.asarray(eps, x.dtype), jnp.asarray(1 - eps, x.dtype)
        x = jnp.where(x < lo, lo, jnp.where(x > hi, hi, x))  # NaN stays NaN
    return jnp.log(x / (1 - x))


@lowering(aten.logit_backward.default)
def logit_backward(grad, x, eps=None):
    grad, x = _float(grad, x)
    value = grad / (x * (1 - x))
    if eps is None:
        return jnp.where((x < 0) | (x > 1), jnp.nan, value).astype(value.dtype)
    return jnp.where((x < eps) | (x > 1 - eps), jnp.zeros_like(value), value)


@lowering(aten.polygamma.default)
def polygamma(n, x):
    (x,) = _float(x)
    return _polygamma(n, x)


@lowering(aten.mvlgamma.default)
def mvlgamma(x, p):
    (x,) = _float(x)
    offsets = jnp.arange(p, dtype=x.dtype) * -0.5  # x, x - 1/2, ..., x - (p-1)/2
    return jnp.sum(lax.lgamma(x[..., None] + offsets), axis=-1) + p * (p - 1) * math.log(math.pi) / 4


@lowering(aten.special_zeta)
def zeta(x, q):
    return _zeta(*_float(x, q))


# -- binary float functions ----------------------------------------------------------


@lowering(aten.atan2.default)
def atan2(y, x):
    return jnp.arctan2(*promote(y, x, kind=Kind.INT_TO_FLOAT, rounded=True))  # Note [Scalars of half operands]


@lowering(aten.copysign.Tensor, aten.copysign.Scalar)
def copysign(x, y):
    return jnp.copysign(*_float(x, y))


@lowering(aten.hypot.default)
def hypot(x, y):
    return jnp.hypot(*promote(x, y, rounded=True))


@lowering(aten.fmax.default)
def fmax(x, y):
    return jnp.fmax(*promote(x, y))


@lowering(aten.fmin.default)
def fmin(x, y):
    return jnp.fmin(*promote(x, y))


@lowering(aten.nextafter.default)
def nextafter(x, y):
    return jnp.nextafter(x, y)  # in the storage dtype: the next half is not the next float


@lowering(aten.heaviside.default)
def heaviside(x, values):
    x, values = promote(x, values)
    return jnp.where(x == 0, values, (x > 0).astype(x.dtype))


def _logaddexp(x, y, log1p_exp):
    if jnp.iscomplexobj(x):
        return _complex_logaddexp(x, y)
    m = jnp.maximum(x, y)
    value = m + log1p_exp(-jnp.abs(x - y))
    return jnp.where(jnp.isinf(x) & (x == y), x, value)


def _complex_logaddexp(x, y):
    """torch's CPU kernel: the operand of the larger real part plus ``log1p(exp(min - max))``
    (a NaN operand is both; two equal infinities give themselves)."""
    nan_x = jnp.isnan(x.real) | jnp.isnan(x.imag)
    nan_y = jnp.isnan(y.real) | jnp.isnan(y.imag)
    x_smaller = x.real < y.real
    low = jnp.where(nan_y, y, jnp.where(nan_x, x, jnp.where(x_smaller, x, y)))
    high = jnp.where(nan_y, y, jnp.where(nan_x, x, jnp.where(x_smaller, y, x)))
    both_inf = jnp.isinf(low.real) & (low == high)
    return jnp.where(both_inf, low, high + jnp.log1p(jnp.exp(low - high)))


@lowering(aten.logaddexp.default)
def logaddexp(x, y):
    return _logaddexp(*promote(x, y), lambda d: jnp.log1p(jnp.exp(d)))


@lowering(aten.logaddexp2.default)
def logaddexp2(x, y):
    return _logaddexp(*promote(x, y), lambda d: jnp.log1p(jnp.exp2(d)) / math.log(2))


def _xlog(log):
    def rule(x, y):
        common = common_dtype(x, y, kind=Kind.INT_TO_FLOAT)
        x, y = promote(x, y, kind=Kind.INT_TO_FLOAT, rounded=True)
        logged = log(y)
        if common in (torch.float16, torch.bfloat16):  # CPU's half kernel rounds the log before the product
            logged = logged.astype(_dtypes.to_jax(common)).astype(logged.dtype)
        value = jnp.where(x == 0, jnp.zeros_like(x), x * logged)
        return jnp.where(jnp.isnan(y), y, value)

    return rule


lowering(aten.xlogy)(_xlog(jnp.log))
lowering(aten.special_xlog1py)(_xlog(jnp.log1p))


@lowering(aten.frexp.Tensor)
def frexp(x):
    mantissa, exponent = jnp.frexp(x)
    return mantissa, exponent.astype(jnp.int32)


# -- integers ------------------------------------------------------------------------


@lowering(aten.bitwise_left_shift, aten.__lshift__.Tensor, aten.__lshift__.Scalar)
def bitwise_left_shift(x, y):
    x, y = promote(x, y)
    bits = 8 * x.dtype.itemsize
    x, y = jnp.broadcast_arrays(x, y)
    out_of_range = (y < 0) | (y >= bits)
    return jnp.where(out_of_range, jnp.zeros_like(x), lax.shift_left(x, jnp.where(out_of_range, 0, y)))


@lowering(aten.bitwise_right_shift, aten.__rshift__.Tensor, aten.__rshift__.Scalar)
def bitwise_right_shift(x, y):
    x, y = promote(x, y)
    bits = 8 * x.dtype.itemsize
    signed = jnp.issubdtype(x.dtype, jnp.signedinteger)
    limit = bits - 1 if signed else bits
    x, y = jnp.broadcast_arrays(x, y)
    shift = jnp.where((y < 0) | (y > limit), limit, y)
    shifted = lax.shift_right_arithmetic(x, shift) if signed else lax.shift_right_logical(x, shift)
    return shifted if signed else jnp.where(shift >= bits, jnp.zeros_like(x), shifted)


@lowering(aten.gcd.default)
def gcd(x, y):
    return jnp.gcd(*promote(x, y))


@lowering(aten.lcm.default)
def lcm(x, y):
    x, y = promote(x, y)
    g = jnp.gcd(x, y)
    return jnp.where(g == 0, jnp.zeros_like(g), jnp.abs(x // jnp.where(g == 0, 1, g) * y))


# -- activations and their backward ops ----------------------------------------------


@lowering(aten.celu.default)
def celu(x, alpha=1.0):
    return elu(x, alpha, 1, 1 / alpha)


def _glu(x, dim):
    a, b = jnp.split(x, 2, axis=dim)
    return a * jax.nn.sigmoid(b)


@lowering(aten.glu.default)
def glu(x, dim=-1):
    (x,) = promote(x)
    return _glu(x, dim)


@lowering(aten.glu_backward.default)
def glu_backward(grad, x, dim):
    grad, x = promote(grad, x)
    _, pullback = jax.vjp(lambda v: _glu(v, dim), x)
    return pullback(grad)[0]


@lowering(aten.hardshrink.default)
def hardshrink(x, lambd=0.5):
    (x,) = promote(x)
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros_like(x), x)


@lowering(aten.hardshrink_backward.default, aten.softshrink_backward.default)
def shrink_backward(grad, x, lambd):
    grad, x = promote(grad, x)
    return jnp.where((x >= -lambd) & (x <= lambd), jnp.zeros_like(grad), grad)


@lowering(aten.softshrink.default)
def softshrink(x, lambd=0.5):
    (x,) = promote(x)
    return jnp.where(x > lambd, x - lambd, jnp.where(x < -lambd, x + lambd, x * 0))


@lowering(aten.mish.default)
def mish(x):
    (x,) = promote(x)
    return x * jnp.tanh(jnp.log1p(jnp.exp(x)))


@lowering(aten.mish_backward.default)
def mish_backward(grad, x):
    grad, x = promote(grad, x)
    sigmoid = 1 / (1 + jnp.exp(-x))
    tanh_softplus = jnp.tanh(jnp.log1p(jnp.exp(x)))
    return grad * (tanh_softplus + x * sigmoid * (1 - tanh_softplus * tanh_softplus))


# -- windows -------------------------------------------------------------------------


def _linspace_traced(start, end, steps: int, target, work, span_in_target: bool = False):
    """factories.linspace's two-sided steps over traced bounds, whose span is
    divided exactly (Note [Exact quotients]). ``span_in_target``: the span is
    rounded to ``target`` first, as logspace's kernel subtracts in it."""
    start, end = (jnp.asarray(v).astype(target) for v in (start, end))
    span = (end - start).astype(work) if span_in_target else end.astype(work) - start.astype(work)
    start, end = start.astype(work), end.astype(work)
    if steps <= 1:
        return jnp.full((steps,), start, work)
    step = divide_exactly(span, jnp.asarray(steps - 1, work))
    idx = jnp.arange(steps)
    front = start + step * idx.astype(work)
    back = end - step * (steps - 1 - idx).astype(work)
    return jnp.where(idx < steps // 2, front, back)


# torch reads 0-d tensor bounds as scalars (signal.windows.kaiser builds its grid this way)
@lowering(aten.linspace.Tensor_Tensor, aten.linspace.Tensor_Scalar, aten.linspace.Scalar_Tensor)
def linspace_tensor(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    target = jax_dtype(dtype)
    return _linspace_traced(start, end, steps, target, jnp.float64 if is_integral(target) else target)


@lowering(aten.logspace.Tensor_Tensor, aten.logspace.Tensor_Scalar, aten.logspace.Scalar_Tensor)
def logspace_tensor(start, end, steps, base=10.0, *, dtype=None, layout=None, device=None, pin_memory=None):
    if steps == 1:  # torch fills base ** start, start not rounded to the result dtype
        return jnp.power(jnp.float64(base), jnp.full((1,), start, jnp.float64))
    exponents = _linspace_traced(start, end, steps, jax_dtype(dtype), jnp.float64, span_in_target=True)
    return jnp.power(jnp.float64(base), exponents)
