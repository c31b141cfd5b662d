"""torch.special's Cephes functions (Bessel, Airy) and orthogonal polynomials.

JAX lacks most of these or computes them another way, so each rule is a
branch-free transcription of torch's CPU kernel (aten/src/ATen/native/Math.h,
derived from the Cephes Math Library; see ``_cephes``): every branch is
evaluated and the one torch takes is selected, special cases last so they
win as torch's early returns do.

Note [Polynomial degree]: the polynomial ops take the degree ``n`` as a
tensor promoted with ``x`` and truncate it to an integer; a NaN, infinite or
out-of-range degree is negative there (x86's conversion of those is
INT64_MIN), which gives 0. Recurrences run in a ``while_loop`` up to the
largest degree present, each element stopping at its own.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch
from jax import lax

from lazytpu.lowering import _cephes as C
from lazytpu.lowering.casts import in_double
from lazytpu.lowering.elementwise import Kind, promote, sqrt
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten

_SQRT_2_PI = 0.797884560802865355879892119868763737  # sqrt(2 / pi)
_2_PI = 0.636619772367581343075535053490057448  # 2 / pi
_PI_4 = 0.785398163397448309615660845819875721
_3PI_4 = 2.356194490192344928846982537459627163


def _polevl(z, coefficients):
    acc = jnp.zeros_like(z)
    for c in coefficients:
        acc = acc * z + c
    return acc


def _chbevl(z, coefficients):
    """Chebyshev series as torch's Bessel kernels sum it; returns ``0.5 * (b0 - b2)``."""
    p, q, b = jnp.zeros_like(z), jnp.zeros_like(z), jnp.full_like(z, coefficients[0])
    for c in coefficients[1:]:
        p, q = q, b
        b = z * q - p + c
    return 0.5 * (b - p)


def _nan_where(condition, value):
    return jnp.where(condition, jnp.nan, value).astype(value.dtype)


# -- Bessel functions of the first and second kind ---------------------------------


def _asymptotic(x, z, order: int, second_kind: bool):
    """The large-``x`` form of J0, J1 (``P cos - Q sin``) and Y0, Y1 (``P sin + Q cos``)."""
    pp, pq, qp, qq = (
        (C.BESSEL_J0_PP, C.BESSEL_J0_PQ, C.BESSEL_J0_QP, C.BESSEL_J0_QQ)
        if order == 0
        else (
            C.BESSEL_J1_PP,
            C.BESSEL_J1_PQ,
            C.BESSEL_J1_QP,
            C.BESSEL_J1_QQ,
        )
    )
    p = _polevl(z, pp) / _polevl(z, pq)
    q = 5.0 / x * (_polevl(z, qp) / _polevl(z, qq))
    phase = x - (_PI_4 if order == 0 else _3PI_4)
    if second_kind:
        value = p * jnp.sin(phase) + q * jnp.cos(phase)
    else:
        value = p * jnp.cos(phase) - q * jnp.sin(phase)
    return value * _SQRT_2_PI / sqrt(x)


def _bessel_j0(x):
    x = jnp.abs(x)
    xx = x * x
    small = (xx - 5.78318596294678452118e00) * (xx - 3.04712623436620863991e01) * _polevl(xx, C.BESSEL_J0_RP)
    small = jnp.where(x < 0.00001, 1.0 - xx / 4.0, small / _polevl(xx, C.BESSEL_J0_RQ))
    z = 25.0 / xx
    large = _asymptotic(x, z, 0, second_kind=False)
    return jnp.where(x <= 5.0, small, large)


def _bessel_j1(x):
    sign, x = jnp.sign(x), jnp.abs(x)
    xx = x * x
    small = _polevl(xx, C.BESSEL_J1_RP) / _polevl(xx, C.BESSEL_J1_RQ) * x
    small = small * (xx - 1.46819706421238932572e01) * (xx - 4.92184563216946036703e01)
    z = 5.0 / x * (5.0 / x)
    large = _asymptotic(x, z, 1, second_kind=False)
    return jnp.where(sign < 0, -1, 1) * jnp.where(x <= 5.0, small, large)


def _bessel_y0(x):
    xx = x * x
    small = _polevl(xx, C.BESSEL_Y0_YP) / _polevl(xx, C.BESSEL_Y0_YQ) + _2_PI * jnp.log(x) * _bessel_j0(x)
    small = _nan_where(x < 0, jnp.where(x == 0, -jnp.inf, small))
    z = 25.0 / xx
    large = _asymptotic(x, z, 0, second_kind=True)
    return jnp.where(x <= 5.0, small, large)


def _bessel_y1(x):
    xx = x * x
    small = x * (_polevl(xx, C.BESSEL_Y1_YP) / _polevl(xx, C.BESSEL_Y1_YQ))
    small = small + _2_PI * (_bessel_j1(x) * jnp.log(x) - 1.0 / x)
    small = _nan_where(x < 0, jnp.where(x == 0, -jnp.inf, small))
    z = 5.0 / x * (5.0 / x)
    large = _asymptotic(x, z, 1, second_kind=True)
    return jnp.where(x <= 5.0, small, large)


def _spherical_bessel_j0(x):
    xx = x * x
    series = 1.0 / 6227020800.0
    for c in (-1.0 / 39916800.0, 1.0 / 362880.0, -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0, 1.0):
        series = c + xx * series
    value = jnp.where(jnp.abs(x) < 0.5, series, jnp.sin(x) / x)
    return jnp.where(jnp.isinf(x), 0.0, value).astype(x.dtype)


# -- modified Bessel functions ---------------------------------------------------------


def _exp(x):
    """``exp`` rounded as CPU's ``expf`` rounds (correctly, almost always): XLA's
    float32 ``exp`` is an ulp off on many inputs, so it runs in float64 where that is native."""
    return in_double(jnp.exp, x)


def _modified_bessel_i(x, small, large):
    """``I0``/``I1`` before their sign: the Chebyshev series in ``|x|``."""
    ax = jnp.abs(x)
    e = _exp(ax)
    inside = _chbevl(ax / 2.0 - 2.0, small) * e
    outside = e * _chbevl(32.0 / ax - 2.0, large) / sqrt(ax)
    return ax, inside, outside


def modified_bessel_i0(x):
    """``I0(x)`` as CPU torch's ``calc_i0`` (``i0``, ``kaiser_window``) and ``modified_bessel_i0`` sum it."""
    ax, inside, outside = _modified_bessel_i(x, C.MODIFIED_BESSEL_I0_A, C.MODIFIED_BESSEL_I0_B)
    return jnp.where(ax <= 8.0, inside, outside)


def _modified_bessel_i1(x):
    ax, inside, outside = _modified_bessel_i(x, C.MODIFIED_BESSEL_I1_A, C.MODIFIED_BESSEL_I1_B)
    value = jnp.where(ax <= 8.0, inside * ax, outside)
    return jnp.where(x < 0, -value, value)


def _modified_bessel_k(x, order: int, scaled: bool):
    if order == 0:
        small = _chbevl(x * x - 2.0, C.MODIFIED_BESSEL_K0_A) - jnp.log(0.5 * x) * modified_bessel_i0(x)
        large_series = C.MODIFIED_BESSEL_K0_B
    else:
        small = jnp.log(0.5 * x) * _modified_bessel_i1(x) + _chbevl(x * x - 2.0, C.MODIFIED_BESSEL_K1_A) / x
        large_series = C.MODIFIED_BESSEL_K1_B
    large = _chbevl(8.0 / x - 2.0, large_series) / sqrt(x)
    if scaled:
        small = small * jnp.exp(x)
    else:
        large = jnp.exp(-x) * large
    value = jnp.where(x <= 2.0, small, large)
    return _nan_where(x < 0, jnp.where(x == 0, jnp.inf, value))


# -- Airy ------------------------------------------------------------------------------


def _airy_ai(x):
    # x < -2.09: the oscillating asymptotic form
    root = jnp.sqrt(-x)
    zeta_neg = -2.0 * x * root / 3.0
    z = 1.0 / zeta_neg
    zz = z * z
    f_ratio = zz * _polevl(zz, C.AIRY_AI_AFN) / _polevl(zz, C.AIRY_AI_AFD)
    g_ratio = z * _polevl(zz, C.AIRY_AI_AGN) / _polevl(zz, C.AIRY_AI_AGD)
    t = zeta_neg + 0.25 * math.pi
    negative = 5.64189583547756286948e-01 / sqrt(root) * (jnp.sin(t) * (1.0 + f_ratio) - jnp.cos(t) * g_ratio)
    # x >= 2.09: the decaying asymptotic form
    zeta_pos = 2.0 * x * jnp.sqrt(x) / 3.0
    ratio = _polevl(1.0 / zeta_pos, C.AIRY_AI_AN) / _polevl(1.0 / zeta_pos, C.AIRY_AI_AD)
    positive = 5.64189583547756286948e-01 * ratio / (2.0 * jnp.sqrt(jnp.sqrt(x)) * jnp.exp(zeta_pos))
    # otherwise the power series, summed until its terms fall below epsilon
    eps = jnp.finfo(x.dtype).eps
    f, g, k, m, n, t = jnp.ones_like(x), x, jnp.ones_like(x), jnp.ones_like(x), x, jnp.ones_like(x)
    cube = x * x * x
    for _ in range(24):
        going = t > eps
        m_next = m * cube / (k + 1) / (k + 2)
        n_next = n * cube / (k + 2) / (k + 3)
        f = jnp.where(going, f + m_next, f)
        g = jnp.where(going, g + n_next, g)
        m, n = jnp.where(going, m_next, m), jnp.where(going, n_next, n)
        k = jnp.where(going, k + 3, k)
        t = jnp.where(going, jnp.abs(m / f), t)
    series = 0.355028053887817239260 * f - 0.258819403792806798405 * g
    value = jnp.where(x < -2.09, negative, jnp.where(x >= 2.09, positive, series))
    value = jnp.where(x > 103.892, 0.0, value)
    return _nan_where(jnp.isinf(x), value)


_BESSEL = {
    aten.special_airy_ai.default: _airy_ai,
    aten.special_bessel_j0.default: _bessel_j0,
    aten.special_bessel_j1.default: _bessel_j1,
    aten.special_bessel_y0.default: _bessel_y0,
    aten.special_bessel_y1.default: _bessel_y1,
    aten.special_modified_bessel_i0.default: modified_bessel_i0,
    aten.special_modified_bessel_i1.default: _modified_bessel_i1,
    aten.special_modified_bessel_k0.default: lambda x: _modified_bessel_k(x, 0, scaled=False),
    aten.special_modified_bessel_k1.default: lambda x: _modified_bessel_k(x, 1, scaled=False),
    aten.special_scaled_modified_bessel_k0.default: lambda x: _modified_bessel_k(x, 0, scaled=True),
    aten.special_scaled_modified_bessel_k1.default: lambda x: _modified_bessel_k(x, 1, scaled=True),
    aten.special_spherical_bessel_j0.default: _spherical_bessel_j0,
}


def _float_unary(fn):
    def rule(x):
        (x,) = promote(x, kind=Kind.INT_TO_FLOAT)
        return fn(x)

    return rule


for _op, _fn in _BESSEL.items():
    lowering(_op)(_float_unary(_fn))


# -- orthogonal polynomials (Note [Polynomial degree]) ---------------------------------


def _degree(n):
    return jnp.where(jnp.abs(n) < 2.0**63, jnp.trunc(n), -1.0).astype(n.dtype)


def _three_term(n, p, q, step):
    """``q`` after the recurrence ``p, q = q, step(j, p, q)`` for ``j = 1 .. n-1``
    (each element's own ``n``); ``q`` unchanged where ``n <= 1``."""
    last = jnp.max(jnp.where(n > 1, n, 1)) if n.size else jnp.asarray(1, n.dtype)

    def body(state):
        j, p, q = state
        going = j < n
        r = step(j, p, q)
        return j + 1, jnp.where(going, q, p), jnp.where(going, r, q)

    _, _, q = lax.while_loop(lambda s: s[0] < last, body, (jnp.ones((), n.dtype), p, q))
    return q


def _parity(n, even, odd):
    return jnp.where(jnp.fmod(n, 2) == 0, even, odd)


def _chebyshev(x, n, kind: str, shifted: bool):
    y = x + x - 1.0 if shifted else x
    one = jnp.ones_like(y)
    q0 = {"t": y, "u": y + y, "v": y + y - 1.0, "w": y + y + 1.0}[kind]
    value = _three_term(n, one, q0, lambda j, p, q: (y + y) * q - p)
    value = jnp.where(n == 1, q0, jnp.where(n == 0, one, value))
    # the trigonometric forms inside (-1, 1), from torch's degree thresholds
    threshold = {"t": 6, "u": 8, "v": 8, "w": 8}[kind] if not shifted else {"t": 6, "u": 6, "v": 6, "w": 4}[kind]
    theta = jnp.arccos(y)
    if kind == "t":
        trig = jnp.cos(n * theta)
    elif kind == "u":
        trig = jnp.where(
            jnp.sin(theta) != 0, jnp.sin((n + 1) * theta) / jnp.sin(theta), (n + 1) * jnp.cos((n + 1) * theta) / y
        )
    elif kind == "v":
        trig = jnp.where(
            jnp.sin(theta / 2) != 1,
            jnp.cos((n + 0.5) * theta) / jnp.cos(theta / 2),
            _parity(n, n + n + 1, -(n + n + 1)),
        )
    else:
        edge = _parity(n, one, -one)
        if not shifted:
            edge = jnp.where(y > 0, n + n + 1, edge)
        trig = jnp.where(jnp.cos(theta / 2) != 1, jnp.sin((n + 0.5) * theta) / jnp.sin(theta / 2), edge)
    value = jnp.where((n > threshold) & (jnp.abs(y) < 1), trig, value)
    # the end points: y == 1 and y == -1 (x == 1 and x == 0 when shifted)
    at_plus = {"t": one, "u": n + 1, "v": one, "w": n + n + 1}[kind]
    at_minus = {
        "t": _parity(n, one, -one),
        "u": _parity(n, n + 1, -(n + 1)),
        "v": _parity(n, n + n + 1, -(n + n + 1)),
        "w": _parity(n, one, -one),
    }[kind]
    if shifted:
        value = jnp.where(x == 0, at_minus, value)
        value = jnp.where(x == 1, at_plus, value)
    else:
        value = jnp.where(jnp.abs(x) == 1, jnp.where(x > 0, at_plus, at_minus), value)
    return value


def _hermite(x, n, physicists: bool):
    limit = {jnp.dtype(jnp.float32): 128, jnp.dtype(jnp.float64): 512}.get(jnp.dtype(x.dtype), 1024)
    one = jnp.ones_like(x)
    steps = jnp.where(n > limit, 0, n)  # NaN past the limit: no need to recur there
    if physicists:
        q0 = x + x
        value = _three_term(steps, one, q0, lambda j, p, q: (x + x) * q - (j + j) * p)
    else:
        q0 = x
        value = _three_term(steps, one, q0, lambda j, p, q: x * q - j * p)
    value = jnp.where(n > limit, jnp.nan, value)
    return jnp.where(n == 1, q0, jnp.where(n == 0, one, value))


def _laguerre(x, n):
    one = jnp.ones_like(x)
    value = _three_term(n, one, 1.0 - x, lambda j, p, q: (((j + j) + (1.0 - x)) * q - j * p) / (j + 1))
    value = jnp.where(n == 1, 1.0 - x, value)
    return jnp.where((n == 0) | (x == 0), one, value)


def _legendre(x, n):
    one = jnp.ones_like(x)
    value = _three_term(n, one, x, lambda j, p, q: ((j + j + 1) * x * q - j * p) / (j + 1))
    value = jnp.where(n == 1, x, jnp.where(n == 0, one, value))
    return jnp.where(jnp.abs(x) == 1, jnp.where((x > 0) | (jnp.fmod(n, 2) == 0), one, -one), value)


def _polynomial(fn):
    def rule(x, n):
        x, n = promote(x, n, kind=Kind.INT_TO_FLOAT)
        x, n = jnp.broadcast_arrays(x, n)
        n = _degree(n)
        return jnp.where(n < 0, jnp.zeros_like(x), fn(x, n))

    return rule


_POLYNOMIALS = {
    aten.special_hermite_polynomial_h: lambda x, n: _hermite(x, n, physicists=True),
    aten.special_hermite_polynomial_he: lambda x, n: _hermite(x, n, physicists=False),
    aten.special_laguerre_polynomial_l: _laguerre,
    aten.special_legendre_polynomial_p: _legendre,
}
for _kind in "tuvw":
    for _shifted in (False, True):
        _name = f"special_{'shifted_' if _shifted else ''}chebyshev_polynomial_{_kind}"
        _POLYNOMIALS[getattr(aten, _name)] = lambda x, n, kind=_kind, shifted=_shifted: _chebyshev(x, n, kind, shifted)

for _op, _fn in _POLYNOMIALS.items():
    lowering(_op)(_polynomial(_fn))
