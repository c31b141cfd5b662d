"""The regularized incomplete gamma functions ``igamma`` (P) and ``igammac``
(Q), as torch's CPU kernels compute them (aten/src/ATen/native/Math.h):
torch's special values, XLA's series and continued fraction, and Temme's
uniform expansion where ``a`` is large and ``x`` near it."""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import jax.scipy.special as jss
import torch
from jax import lax

from lazytpu.lowering.casts import in_double
from lazytpu.lowering.elementwise import Kind, promote
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _float(*xs):
    return promote(*xs, kind=Kind.INT_TO_FLOAT)


@lowering(aten.igamma.default)
def igamma(a, x):
    return _incomplete_gamma(*_float(a, x), upper=False)


@lowering(aten.igammac.default)
def igammac(a, x):
    return _incomplete_gamma(*_float(a, x), upper=True)


def _incomplete_gamma(a, x, *, upper: bool):
    # torch's special cases (Math.h calc_igamma / calc_igammac), then SciPy's algorithm via JAX
    a, x = jnp.broadcast_arrays(a, x)
    value = _gammainc(a, x, upper)
    low, high = (1.0, 0.0) if upper else (0.0, 1.0)  # the value as x -> 0 and as x -> inf
    value = jnp.where(jnp.isinf(x), high, value)
    value = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), jnp.nan, low), value)
    value = jnp.where(x == 0, low, value)
    value = jnp.where(a == 0, jnp.where(x > 0, high, jnp.nan), value)
    return jnp.where((a < 0) | (x < 0), jnp.nan, value).astype(a.dtype)


def _gammainc(a, x, upper: bool):
    """Note [Incomplete gamma for large a]: XLA's incomplete gamma (SciPy's
    series and continued fraction) has no asymptotic expansion for large
    ``a``: near ``x`` ~ ``a`` it needs about sqrt(a) terms, so it is wrong
    there (``igammac(1e10, 1e10)`` 0.93, ``1e20`` inf; CPU 0.5) or, in
    float64 at ``a`` = 1e20, never ends. Where torch's Math.h uses Temme's
    uniform expansion (DLMF 8.12.3-8.12.4; ``a`` > 20 and ``x`` within 0.3 a
    below ``a`` = 200, within 4.5 sqrt(a) above), so does this; XLA's
    function sees (1, 1) there. Where float64 is native (not TPU), float32
    computes in float64 and rounds (``in_double``)."""

    def fn(a, x):
        near = ((a > 20) & (a < 200) & (jnp.abs(x - a) < 0.3 * a)) | (
            (a > 200) & (jnp.abs(x - a) < 4.5 * jnp.sqrt(jnp.where(a > 200, a, 1.0)))
        )
        one = jnp.ones_like(a)
        far = (jss.gammaincc if upper else jss.gammainc)(jnp.where(near, one, a), jnp.where(near, one, x))
        return jnp.where(near, _temme(jnp.where(near, a, 30.0), jnp.where(near, x, 30.0), upper), far)

    return in_double(fn, a, x)


def _temme(a, x, upper: bool):
    """Q(a, x) (or P) by Temme's expansion, for x within 0.3 a of a > 20
    (Note [Incomplete gamma for large a]): 1/2 erfc(eta sqrt(a/2)) + R, with
    R = exp(-a eta^2 / 2) / sqrt(2 pi a) * sum_k c_k(eta) a^-k."""
    # (as products with tables of coefficients: unrolled, XLA:CPU's compile of the series ran out of memory)
    sigma = (x - a) / a
    # sigma - log1p(sigma) = sigma^2 sum_{n>=0} (-1)^n sigma^n / (n + 2), a series: |sigma| < 0.3 here
    series = jnp.asarray([(-1) ** n / (n + 2) for n in range(47)], a.dtype)
    tail = jnp.matmul(_powers(sigma, len(series)), series, precision=lax.Precision.HIGHEST)
    eta = jnp.sign(sigma) * jnp.sqrt(2 * tail) * jnp.abs(sigma)
    table = jnp.asarray(_temme_coefficients(), a.dtype)  # [k, n]
    c = jnp.matmul(_powers(eta, table.shape[1]), table.T, precision=lax.Precision.HIGHEST)  # c_k(eta), k last
    total = jnp.sum(c * _powers(1 / a, table.shape[0]), axis=-1)
    rest = jnp.exp(-a * eta * eta / 2) / jnp.sqrt(2 * math.pi * a) * total
    root = eta * jnp.sqrt(a / 2)
    return 0.5 * jss.erfc(root) + rest if upper else 0.5 * jss.erfc(-root) - rest


def _powers(x, n: int):
    """x^0 .. x^(n-1) along a new last axis."""
    return jnp.cumprod(jnp.concatenate([jnp.ones_like(x)[..., None], jnp.repeat(x[..., None], n - 1, -1)], -1), -1)


@functools.cache
def _temme_coefficients(terms: int = 25) -> tuple[tuple[float, ...], ...]:
    """d[k][n]: c_k(eta) = sum_n d[k][n] eta^n (DLMF 8.12.9-8.12.12), computed
    once in 40-digit arithmetic. c_0 = 1/mu - 1/eta, mu = lambda - 1 the
    inverse of eta(mu) = mu sqrt(2 (mu - log(1 + mu))) / |mu| (Lagrange
    inversion); c_k = c_{k-1}'/eta + g_k c_0, g_k the Stirling series of
    Gamma*(a) with alternating sign."""
    import mpmath

    with mpmath.workdps(40):
        size = 3 * terms + 2

        def inverse(series):  # of a series with series[0] != 0
            out = [1 / series[0]]
            for n in range(1, len(series)):
                out.append(-sum(series[j] * out[n - j] for j in range(1, n + 1)) / series[0])
            return out

        # eta / mu = sqrt(h), h = 2 sum_m (-1)^m mu^m / (m + 2)
        h = [mpmath.mpf(2) * (-1) ** m / (m + 2) for m in range(size)]
        root = [mpmath.mpf(1)]
        for n in range(1, size):
            root.append((h[n] - sum(root[j] * root[n - j] for j in range(1, n))) / 2)
        phi = inverse(root)  # mu / eta(mu)
        # mu = sum alpha_n eta^n, alpha_n = [w^(n-1)] phi(w)^n / n
        alpha, power = [], [mpmath.mpf(1)] + [mpmath.mpf(0)] * (size - 1)
        for n in range(1, size):
            power = [mpmath.fsum(power[j] * phi[i - j] for j in range(i + 1)) for i in range(size)]
            alpha.append(power[n - 1] / n)  # alpha[n - 1] is alpha_n
        c0 = inverse(alpha)[1:]  # 1/mu - 1/eta, as a series in eta
        beta = [mpmath.mpf(0)] * (terms + 1)  # log Gamma*(a) = sum beta_j a^-j
        for m in range(1, terms // 2 + 2):
            if 2 * m - 1 <= terms:
                beta[2 * m - 1] = mpmath.bernoulli(2 * m) / (2 * m * (2 * m - 1))
        g = [mpmath.mpf(1)]
        for n in range(1, terms + 1):
            g.append(sum(j * beta[j] * g[n - j] for j in range(1, n + 1)) / n)
        rows = [c0]
        for k in range(1, terms):
            rows.append([(-1) ** k * g[k] * c0[n] + (n + 2) * rows[-1][n + 2] for n in range(len(rows[-1]) - 2)])
        return tuple(tuple(float(v) for v in row[:terms]) for row in rows)
