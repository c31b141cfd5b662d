"""Complex unary functions as CPU torch computes them, special values included.

Note [Complex special values]: CPU torch computes a complex exp, log, sqrt,
trig, hyperbolic or inverse function with ``std::complex``, that is glibc's
C99 Annex G functions (``cexp``, ``csqrt``, ``casinh``, ...); a few
functions use torch's own formulas instead (expm1 and log1p in
c10/util/complex_math.h; exp2, log2, log10, rsqrt, reciprocal, sigmoid and sgn
in the vectorized CPU kernels). Two rules there that XLA does not follow:

1. The sign of a zero part picks a side. ``sqrt(-2 - 0j)`` is ``-1.414j``,
   not ``+1.414j``: a zero imaginary part keeps its sign through the branch
   cut on the real axis (sqrt, log, asin, acos, acosh, atanh), a zero real part
   through the cut on the imaginary axis (asinh, atan), and zero results carry
   the sign their formula gives (``exp(x - 0j)`` is ``e^x - 0j``). These are
   silent wrong answers otherwise: ``conj()`` and FFTs produce ``-0.0``
   imaginary parts all the time.
2. An infinite part wins over a NaN where the limit exists (``exp(inf + nanj)``
   is ``inf + nanj``, ``log(nan + infj)`` is ``inf + nanj``), and a NaN stays
   confined to the part it reaches (``cosh(0 + infj)`` is ``nan + 0j``).

Each function here starts from jnp's value where it is accurate (from the
first quadrant, ``|x| + i|y|``, with the signs then copied from the input by
``jnp.copysign``, for the inverse functions), or from the real formula glibc
or torch evaluates (sinh, cosh, expm1, reciprocal), and selects glibc's or
torch's value on the special cases with ``jnp.where``. Results are built from
real parts with ``lax.complex``, never with complex arithmetic, which loses
the signs of zeros (``(a + bj) * 1`` turns ``-0j`` into ``+0j``); and a sum
with a literal zero is a select, as XLA folds ``v + 0`` to ``v``.

CPU torch itself is the reference, including where its paths disagree: its
complex128 acos is ``pi/2 - asin(z)`` but its complex64 acos is glibc's
cacosf; sgn of a tensor's last few elements (those that do not fill a vector)
divides as c10::complex does and differs from the rest on zeros and
infinities, which follow the vectorized kernel here.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

_PI, _PI_2, _PI_4 = math.pi, math.pi / 2, math.pi / 4
_LN2, _LN10 = math.log(2.0), math.log(10.0)
_INF, _NAN = math.inf, math.nan
# |x| beyond which exp(-|x|) is lost next to exp(|x|)
_NEGLIGIBLE_EXP = {jnp.dtype(jnp.float32): 9.0, jnp.dtype(jnp.float64): 19.0}


def _parts(z):
    return jnp.real(z), jnp.imag(z)


def _make(re, im):
    re, im = jnp.broadcast_arrays(re, im)
    return lax.complex(re, im)


def _pick(default, *cases):
    """``default`` where no case holds, else the value of the first ``(mask, value)`` that does."""
    out = default
    for mask, value in reversed(cases):
        out = jnp.where(mask, value, out)
    return out


def _plus_zero(v):
    """``v + 0.0`` as IEEE adds it: ``-0`` becomes ``+0`` (and ``0 - v`` is ``_plus_zero(-v)``).

    XLA's simplifier folds a literal ``v + 0`` to ``v``, hence the select."""
    return jnp.where(v == 0, 0.0, v)


def _turn(z):
    """``i * z``, exactly (signs of zeros kept)."""
    x, y = _parts(z)
    return _make(-y, x)


def _unturn(z):
    """``-i * z``, exactly."""
    x, y = _parts(z)
    return _make(y, -x)


def _first_quadrant(fn, z):
    """``fn`` at ``|x| + i|y|``: the same magnitudes whichever side of a branch cut ``z`` lies on."""
    x, y = _parts(z)
    return _parts(fn(_make(jnp.abs(x), jnp.abs(y))))


# -- exponential and logarithms ------------------------------------------------------


def exp(z):
    x, y = _parts(z)
    re, im = _parts(jnp.exp(z))
    wild = ~jnp.isfinite(y)
    re = _pick(re, (wild & (x == _INF), _INF), (wild & (x == -_INF), 0.0))
    im = _pick(im, (y == 0, y), (wild & (x == -_INF), jnp.copysign(0.0, y)))
    return _make(re, im)


def exp2(z):
    """torch's vectorized kernel: ``exp(z * ln 2)`` with a real product."""
    x, y = _parts(z)
    return exp(_make(x * _LN2, y * _LN2))


def expm1(z):
    """c10's formula, ``expm1(x) cos(y) - 2 sin(y/2)^2 + i e^x sin(y)``."""
    x, y = _parts(z)
    half = jnp.sin(y / 2)
    return _make(jnp.expm1(x) * jnp.cos(y) - 2 * half * half, jnp.exp(x) * jnp.sin(y))


def log(z):
    x, y = _parts(z)
    re, im = _parts(jnp.log(z))
    re = jnp.where(jnp.isinf(x) | jnp.isinf(y), _INF, re)
    return _make(re, jnp.copysign(im, y))


def log2(z):
    re, im = _parts(log(z))
    return _make(re / _LN2, im / _LN2)


def log10(z):
    re, im = _parts(log(z))
    return _make(re / _LN10, im / _LN10)


def log1p(z):
    """jnp's value; c10 returns ``x`` itself where ``x(2 + x) + y^2`` rounds to 0."""
    x, _ = _parts(z)
    re, im = _parts(jnp.log1p(z))
    return _make(jnp.where((re == 0) & (jnp.abs(z) < 0.5), x, re), im)


def sqrt(z):
    x, y = _parts(z)
    re, im = _parts(jnp.sqrt(z))
    re = _pick(re, (jnp.isinf(y), _INF), (x == -_INF, jnp.where(jnp.isnan(y), _NAN, 0.0)), (x == _INF, _INF))
    im = _pick(
        jnp.copysign(im, y),
        (jnp.isinf(y), y),
        (x == -_INF, jnp.copysign(_INF, y)),
        (x == _INF, jnp.where(jnp.isnan(y), _NAN, jnp.copysign(0.0, y))),
    )
    return _make(re, im)


def reciprocal(z):
    """``1 / z`` as c10::complex divides (Smith's algorithm, no scaling)."""
    c, d = _parts(z)
    wide = jnp.abs(c) >= jnp.abs(d)
    rat = jnp.where(wide, d / c, c / d)
    scale = 1 / jnp.where(wide, c + d * rat, d + c * rat)
    re = jnp.where(wide, (1 + 0 * rat) * scale, _plus_zero(rat) * scale)
    im = jnp.where(wide, (0 - rat) * scale, (0 * rat - 1) * scale)
    zero = (c == 0) & (d == 0)
    return _make(jnp.where(zero, 1 / jnp.abs(c), re), jnp.where(zero, _NAN, im))


def divide(z, w):
    """``z / w`` as c10::complex divides (Smith's algorithm, as ``reciprocal``):
    a division by an infinite ``w`` with a NaN ratio of its parts is NaN, by
    a zero one ``a/0 + (b/0)i``, as on CPU (XLA's gives 0 and infinities)."""
    a, b = _parts(z)
    c, d = _parts(w)
    wide = jnp.abs(c) >= jnp.abs(d)
    rat = jnp.where(wide, d / c, c / d)
    scale = 1 / jnp.where(wide, c + d * rat, d + c * rat)
    re = jnp.where(wide, (a + b * rat) * scale, (a * rat + b) * scale)
    im = jnp.where(wide, (b - a * rat) * scale, (b * rat - a) * scale)
    zero = (c == 0) & (d == 0)
    return _make(jnp.where(zero, a / jnp.abs(c), re), jnp.where(zero, b / jnp.abs(d), im))


def rsqrt(z):
    return reciprocal(sqrt(z))


def sigmoid(z):
    """torch's ``1 / (1 + exp(-z))``, its sum taken part by part."""
    x, y = _parts(z)
    re, im = _parts(exp(_make(-x, -y)))
    return reciprocal(_make(1 + re, _plus_zero(im)))


def sgn(z):
    """torch's vectorized ``z / |z|``, part by part, and 0 where ``|z|`` is 0 (Note [Complex special values])."""
    x, y = _parts(z)
    mag = jnp.abs(z)
    zero = mag == 0
    return _make(jnp.where(zero, 0.0, x / mag), jnp.where(zero, 0.0, y / mag))


# -- hyperbolic and trigonometric ------------------------------------------------------


def _sinh_cosh(x, y):
    """``(sinh(x) cos(y), sinh(x) sin(y), cosh(x) cos(y), cosh(x) sin(y))`` for finite parts.

    Where ``exp(-|x|)`` is below rounding, sinh and cosh are ``exp(|x|) / 2``, taken as
    ``exp(|x|/2)`` twice as glibc does, so that the product overflows only if the result does
    (and XLA's float32 sinh and cosh there are 12 ulps off).
    """
    s, c = jnp.sin(y), jnp.cos(y)
    sh, ch = jnp.sinh(x), jnp.cosh(x)
    half = jnp.exp(jnp.abs(x) / 2)
    big = jnp.abs(x) > _NEGLIGIBLE_EXP[x.dtype]
    sign = jnp.copysign(1.0, x)

    def scaled(plain, trig, signed):
        wide = (half * 0.5 * trig) * half
        return jnp.where(big, sign * wide if signed else wide, plain * trig)

    return scaled(sh, c, True), scaled(sh, s, True), scaled(ch, c, False), scaled(ch, s, False)


def sinh(z):
    x, y = _parts(z)
    re, _, _, im = _sinh_cosh(x, y)
    tame, inf_x = jnp.isfinite(y), jnp.isinf(x)
    re = _pick(re, (inf_x & ~tame, _INF), ((x == 0) & ~tame, x), (~tame, _NAN))
    im = _pick(im, (y == 0, y), (~tame, _NAN))
    return _make(re, im)


def cosh(z):
    x, y = _parts(z)
    _, im, re, _ = _sinh_cosh(x, y)
    tame, inf_x = jnp.isfinite(y), jnp.isinf(x)
    re = _pick(re, (inf_x & ~tame, _INF), (~tame, _NAN))
    im = _pick(im, (y == 0, jnp.where(jnp.signbit(x) & ~jnp.isnan(x), -y, y)), ((x == 0) & ~tame, 0.0), (~tame, _NAN))
    return _make(re, im)


def tanh(z):
    x, y = _parts(z)
    re, im = _parts(jnp.tanh(z))
    tame, inf_x = jnp.isfinite(y), jnp.isinf(x)
    turn = jnp.sin(y) * jnp.cos(y)  # the sign of sin(2y)
    re = _pick(re, (inf_x, jnp.copysign(1.0, x)), (x == 0, x), (~tame, _NAN))
    im = _pick(
        jnp.where(im == 0, jnp.copysign(0.0, turn), im),
        (inf_x, jnp.copysign(0.0, jnp.where(tame, turn, y))),
        (jnp.isnan(x) & (y == 0), y),
        (~tame, _NAN),
    )
    return _make(re, im)


def sin(z):
    """``-i sinh(iz)``; but glibc's csin gives ``+inf`` imaginary parts where both parts are wild."""
    x, y = _parts(z)
    re, im = _parts(_unturn(sinh(_turn(z))))
    return _make(re, jnp.where(~jnp.isfinite(x) & jnp.isinf(y), _INF, im))


def cos(z):
    return cosh(_turn(z))


def tan(z):
    return _unturn(tanh(_turn(z)))


# -- inverse functions -------------------------------------------------------------------


def asinh(z):
    x, y = _parts(z)
    re, im = _first_quadrant(jnp.arcsinh, z)
    re, im = jnp.copysign(re, x), jnp.copysign(im, y)
    nan_x, inf_x, inf_y = jnp.isnan(x), jnp.isinf(x), jnp.isinf(y)
    re = _pick(re, (inf_y, jnp.copysign(_INF, x)), (inf_x | nan_x, x), (jnp.isnan(y), _NAN))
    im = _pick(
        im,
        (inf_y & nan_x, _NAN),
        (inf_y, jnp.copysign(jnp.where(inf_x, _PI_4, _PI_2), y)),
        ((inf_x & jnp.isfinite(y)) | (nan_x & (y == 0)), jnp.copysign(0.0, y)),
        (inf_x | nan_x | jnp.isnan(y), _NAN),
    )
    return _make(re, im)


def asin(z):
    x, y = _parts(z)
    re, im = _parts(_unturn(asinh(_turn(z))))
    nan = jnp.isnan(x) | jnp.isnan(y)
    wild = jnp.isinf(x) | jnp.isinf(y)
    re = jnp.where(nan, jnp.where(x == 0, x, _NAN), re)
    im = jnp.where(nan, jnp.where(wild & (x != 0), jnp.copysign(_INF, y), _NAN), im)
    return _make(re, im)


def acos(z):
    """complex128: torch's ``pi/2 - asin(z)``, its difference taken part by part (``0 - (-0)``
    is ``+0``); complex64: glibc's cacosf."""
    re, im = _parts(asin(z))
    if z.dtype == jnp.complex128:
        return _make(_PI_2 - re, _plus_zero(-im))
    x, y = _parts(z)
    special = ~jnp.isfinite(x) | ~jnp.isfinite(y) | ((x == 0) & (y == 0))
    re_s = _PI_2 - re
    fin_re, fin_im = _parts(jnp.arccos(_make(x, jnp.abs(y))))
    re = jnp.where(special, jnp.where(re_s == 0, 0.0, re_s), jnp.abs(fin_re))
    im = jnp.where(special, -im, jnp.copysign(jnp.abs(fin_im), -y))  # Im acos has the sign of -y
    return _make(re, im)


def acosh(z):
    x, y = _parts(z)
    re, im = _parts(jnp.arccosh(_make(x, jnp.abs(y))))
    re, im = jnp.abs(re), jnp.copysign(jnp.abs(im), y)
    nan_x, inf_x, inf_y = jnp.isnan(x), jnp.isinf(x), jnp.isinf(y)
    wild = nan_x | jnp.isnan(y)
    re = _pick(re, (inf_x | inf_y, _INF), (wild, _NAN))
    corner = jnp.where(x < 0, _PI - _PI_4, _PI_4)
    im = _pick(
        im,
        (inf_y & nan_x, _NAN),
        (inf_y, jnp.copysign(jnp.where(inf_x, corner, _PI_2), y)),
        (inf_x & ~wild, jnp.copysign(jnp.where(jnp.signbit(x), _PI, 0.0), y)),
        ((x == 0) & jnp.isnan(y), _PI_2),
        (inf_x | wild, _NAN),
        ((x == 0) & (y == 0), jnp.copysign(_PI_2, y)),
    )
    return _make(re, im)


def atanh(z):
    return _unturn(atan(_turn(z)))


def atan(z):
    x, y = _parts(z)
    re, im = _first_quadrant(jnp.arctan, z)
    eps = jnp.finfo(x.dtype).eps
    pole = (jnp.abs(y) == 1) & (jnp.abs(x) < eps * eps)  # glibc's log form where x^2 underflows
    im = jnp.where(pole, 0.5 * (_LN2 - jnp.log(jnp.abs(x))), im)
    re, im = jnp.copysign(re, x), jnp.copysign(im, y)
    inf_x, inf_y, nan_x, nan_y = jnp.isinf(x), jnp.isinf(y), jnp.isnan(x), jnp.isnan(y)
    re = _pick(re, (inf_x | (inf_y & ~nan_x), jnp.copysign(_PI_2, x)), (nan_x | nan_y, _NAN))
    im = _pick(im, (inf_x | inf_y, jnp.copysign(0.0, y)), (nan_x | nan_y, jnp.where(y == 0, y, _NAN)))
    return _make(re, im)


def complex_or(fn, complex_fn):
    """A unary function that is ``complex_fn`` on complex operands and ``fn`` on the others.

    The choice is made while tracing, so float and integer programs are unchanged.
    """

    def chosen(x):
        return complex_fn(x) if jnp.iscomplexobj(x) else fn(x)

    chosen.__name__ = getattr(fn, "__name__", complex_fn.__name__)
    return chosen
