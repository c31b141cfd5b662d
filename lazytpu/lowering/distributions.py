"""The samplers and reparameterized gradients under ``torch.distributions``.

``Gamma``, ``Beta``, ``Chi2``, ``StudentT`` and ``Dirichlet`` sample through
``_standard_gamma`` / ``_sample_dirichlet``, ``Poisson`` through ``poisson``,
``Binomial`` through ``binomial``; ``rsample`` differentiates a Gamma draw
through ``_standard_gamma_grad``. Draws come from the device's key as every
random op's (Note [Random entry points] in lowering.random), in float32 at
least, with CPU torch's clamps: a Gamma draw is never below the smallest
normal number, and neither is a Dirichlet component.

Note [Gamma's reparameterized gradient]: ``_standard_gamma_grad(alpha, x)``
is not random, so it computes what CPU torch's kernel computes (aten's
``standard_gamma_grad_one``, in double precision): a Taylor series for
``x < 0.8``, a Rice saddle-point expansion for ``alpha > 8``, else a
bivariate rational fit in ``log(x / alpha)`` and ``log(alpha)``. JAX's own
``random_gamma_grad`` uses another approximation, 1e-4 relative away from it
at large ``alpha``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from lazytpu.lowering.random import sampling_dtype
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _gamma(key, alpha, dtype):
    """Standard Gamma draws of ``alpha``'s shape, at least the smallest normal number (as CPU's)."""
    sample = jax.random.gamma(key, alpha.astype(dtype), dtype=dtype)
    return jnp.maximum(jnp.where(alpha > 0, sample, 0), jnp.finfo(dtype).tiny)


@lowering(aten._standard_gamma.default, random=True)
def standard_gamma(alpha, generator=None, *, key):
    return _gamma(key, alpha, sampling_dtype(alpha.dtype))


@lowering(aten._sample_dirichlet.default, random=True)
def sample_dirichlet(alpha, generator=None, *, key):
    dtype = sampling_dtype(alpha.dtype)
    draws = _gamma(key, alpha, dtype)
    return jnp.maximum(draws / draws.sum(-1, keepdims=True), jnp.finfo(dtype).tiny)


@lowering(aten.poisson.default, random=True)
def poisson(rate, generator=None, *, key):
    """Negative and NaN rates fail the value check of ``poisson`` before anyone reads this."""
    return jax.random.poisson(key, jnp.maximum(rate.astype(sampling_dtype(rate.dtype)), 0), dtype=jnp.int64)


@lowering(aten.binomial.default, random=True)
def binomial(count, prob, generator=None, *, key):
    """CPU's cases first: no trials or ``prob <= 0`` draw 0, ``prob >= 1`` draws ``count``, a NaN ``prob`` NaN."""
    dtype = sampling_dtype(count.dtype)
    n, p = jnp.broadcast_arrays(count.astype(dtype), prob.astype(dtype))
    inside = (n > 0) & (p > 0) & (p < 1)
    draws = jax.random.binomial(key, jnp.where(inside, n, 1), jnp.where(inside, p, 0.5), dtype=dtype)
    edge = jnp.where((n <= 0) | (p <= 0), 0, jnp.where(p >= 1, n, jnp.nan))
    return jnp.where(inside, draws, edge)


# fmt: off
_RATIONAL = (  # aten's coef_uv: rows are the coefficients of 1, u, u**2; p's four, then q's four
    (0.16009398, -0.094634809, 0.025146376, -0.0030648343, 1, 0.32668115, 0.10406089, 0.0014179084),
    (0.53487893, 0.1298071, 0.065735949, -0.0015649758, 0.16639465, 0.020070113, -0.0035938915, -0.00058392623),
    (0.040121004, -0.0065914022, -0.0026286047, -0.0013441777,
     0.017050642, -0.0021309326, 0.00085092367, -1.5247877e-07),
)
# fmt: on


def _gamma_grad_small_x(alpha, x):
    numer, denom = jnp.ones_like(x), alpha
    series1, series2 = numer / denom, numer / (denom * denom)
    for i in range(1, 6):
        numer = numer * -x / i
        denom = denom + 1
        series1 = series1 + numer / denom
        series2 = series2 + numer / (denom * denom)
    pow_x_alpha = x**alpha
    pdf = x ** (alpha - 1) * jnp.exp(-x)
    cdf_alpha = (jnp.log(x) - _digamma_one(alpha)) * pow_x_alpha * series1 - pow_x_alpha * series2
    result = -cdf_alpha / pdf
    return jnp.where(jnp.isnan(result), 0, result)


def _gamma_grad_large_alpha(alpha, x):
    near = (0.9 * alpha <= x) & (x <= 1.1 * alpha)
    numer_1 = 1 + 24 * alpha * (1 + 12 * alpha)
    numer_2 = 1440 * alpha * alpha + 6 * x * (53 - 120 * x) - 65 * x * x / alpha + alpha * (107 + 3600 * x)
    saddle = numer_1 * numer_2 / (1244160 * (alpha * alpha) * (alpha * alpha))
    denom = jnp.sqrt(8 * alpha)
    term2 = denom / (alpha - x)
    term3 = (x - alpha - alpha * jnp.log(x / alpha)) ** -1.5
    term23 = jnp.where(x < alpha, term2 - term3, term2 + term3)
    term1 = jnp.log(x / alpha) * term23 - jnp.sqrt(2 / alpha) * (alpha + x) / ((alpha - x) * (alpha - x))
    stirling = 1 + 1 / (12 * alpha) * (1 + 1 / (24 * alpha))
    return jnp.where(near, saddle, -stirling * x * term1 / denom)


def _gamma_grad_rational(alpha, x):
    u, v = jnp.log(x / alpha), jnp.log(alpha)
    c = [_RATIONAL[0][i] + u * (_RATIONAL[1][i] + u * _RATIONAL[2][i]) for i in range(8)]
    p = c[0] + v * (c[1] + v * (c[2] + v * c[3]))
    q = c[4] + v * (c[5] + v * (c[6] + v * c[7]))
    return jnp.exp(p / q)


@lowering(aten._standard_gamma_grad.default)
def standard_gamma_grad(alpha, x):
    """Note [Gamma's reparameterized gradient]."""
    a, s = jnp.broadcast_arrays(alpha.astype(_wide()), x.astype(_wide()))
    grad = jnp.where(
        s < 0.8,
        _gamma_grad_small_x(a, s),
        jnp.where(a > 8, _gamma_grad_large_alpha(a, s), _gamma_grad_rational(a, s)),
    )
    return grad.astype(alpha.dtype)


# Note [Dirichlet's reparameterized gradient]: ``_dirichlet_grad(x, alpha,
# total)`` (``Dirichlet.rsample`` and ``Beta.rsample``'s backward) is aten's
# ``dirichlet_grad_one``: Taylor series near x = 0 and x = 1 (in the tensor's
# own dtype, as CPU computes them), a Rice saddle-point expansion where alpha
# and total - alpha both exceed 6, else a rational correction to an analytic
# approximation (both in double precision).

_DIRICHLET_RATIONAL = (  # aten's c[2][3][3][4]: p's, then q's coefficients, by power of u, of a, of b
    (
        (
            (1.003668233, -0.01061107488, -0.0657888334, 0.01201642863),
            (0.6336835991, -0.3557432599, 0.05486251648, -0.001465281033),
            (-0.03276231906, 0.004474107445, 0.002429354597, -0.0001557569013),
        ),
        (
            (0.221950385, -0.3187676331, 0.01799915743, 0.01074823814),
            (-0.2951249643, 0.06219954479, 0.01535556598, 0.001550077057),
            (0.02155310298, 0.004170831599, 0.001292462449, 6.976601077e-05),
        ),
        (
            (-0.05980841433, 0.008441916499, 0.01085618172, 0.002319392565),
            (0.02911413504, 0.01400243777, -0.002721828457, 0.000751041181),
            (0.005900514878, -0.001936558688, -9.495446725e-06, 5.385558597e-05),
        ),
    ),
    (
        (
            (1, -0.02924021934, -0.04438342661, 0.007285809825),
            (0.6357567472, -0.3473456711, 0.05454656494, -0.002407477521),
            (-0.03301322327, 0.004845219414, 0.00231480583, -0.0002307248149),
        ),
        (
            (0.5925320577, -0.1757678135, 0.01505928619, 0.000564515273),
            (0.1014815858, -0.06589186703, 0.01272886114, -0.0007316646956),
            (-0.007258481865, 0.001096195486, 0.0003934994223, -4.12701925e-05),
        ),
        (
            (0.06469649321, -0.0236701437, 0.002902096474, -5.896963079e-05),
            (0.001925008108, -0.002869809258, 0.0008000589141, -6.063713228e-05),
            (-0.0003477407336, 6.959756487e-05, 1.097287507e-05, -1.650964693e-06),
        ),
    ),
)


def _wide():
    return jnp.float64 if jax.config.jax_enable_x64 else jnp.float32


_PSI_10 = 2.25175258906672110764
_DIGAMMA_ASYMPTOTIC = (
    8.33333333333333333333e-2,
    -2.10927960927960927961e-2,
    7.57575757575757575758e-3,
    -4.16666666666666666667e-3,
    3.96825396825396825397e-3,
    -8.33333333333333333333e-3,
    8.33333333333333333333e-2,
)


def _digamma_one(x):
    """aten's ``digamma_one<scalar_t, double>`` for ``x > 0`` of ``x``'s dtype: the
    recurrence to ``x >= 10`` and the asymptotic series, each step in the
    precision aten's mixes ``scalar_t`` and ``double`` in."""
    acc = _wide()
    result = jnp.zeros(x.shape, acc)
    for _ in range(10):  # x > 0 reaches 10 within ten steps
        below = x < 10
        result = jnp.where(below, result - (1 / x).astype(acc), result)
        x = jnp.where(below, x + 1, x)
    z = 1.0 / (x * x).astype(acc)
    series = jnp.zeros_like(z)
    for coefficient in _DIGAMMA_ASYMPTOTIC:
        series = series * z + coefficient
    y = jnp.where(x < 1.0e17, z * series, 0)
    asymptotic = result + jnp.log(x).astype(acc) - (0.5 / x).astype(acc) - y
    value = jnp.where(x == 10, result + _PSI_10, asymptotic)
    return jnp.where(x == 0, jnp.inf, value).astype(x.dtype)


def _beta_grad_alpha_small(x, alpha, beta):
    factor = _digamma_one(alpha) - _digamma_one(alpha + beta) - jnp.log(x)
    numer = jnp.ones_like(x)
    series = numer / alpha * (factor + 1 / alpha)
    for i in range(1, 11):
        numer = numer * (i - beta) * x / i
        denom = alpha + i
        series = series + numer / denom * (factor + 1 / denom)
    result = x * (1 - x) ** -beta * series
    return jnp.where(jnp.isnan(result), 0, result)


def _beta_grad_beta_small(x, alpha, beta):
    factor = _digamma_one(alpha + beta) - _digamma_one(beta)
    numer, betas, dbetas = jnp.ones_like(x), jnp.ones_like(x), jnp.zeros_like(x)
    series = factor / alpha
    for i in range(1, 9):
        numer = numer * -x / i
        dbetas = dbetas * (beta - i) + betas
        betas = betas * (beta - i)
        series = series + numer / (alpha + i) * (dbetas + factor * betas)
    result = -((1 - x) ** (1 - beta)) * series
    return jnp.where(jnp.isnan(result), 0, result)


def _beta_grad_alpha_mid(x, alpha, beta):
    total = alpha + beta
    mean = alpha / total
    std = jnp.sqrt(alpha * beta / (total + 1)) / total
    near = (mean - 0.1 * std <= x) & (x <= mean + 0.1 * std)  # avoids the singularity at x = mean
    b2 = beta * beta
    poly = 47 * x * b2 * b2 + alpha * (
        (43 + 20 * (16 + 27 * beta) * x) * b2 * beta
        + alpha
        * (
            3 * (59 + 180 * beta - 90 * x) * b2
            + alpha * ((453 + 1620 * beta * (1 - x) - 455 * x) * beta + alpha * (8 * (1 - x) * (135 * beta - 11)))
        )
    )
    prefactor_num = (1 + 12 * alpha) * (1 + 12 * beta) / (total * total)
    prefactor_den = 12960 * alpha * alpha * alpha * b2 * (1 + 12 * total)
    at_mean = prefactor_num / (1 - x) * poly / prefactor_den
    prefactor = -x / jnp.sqrt(2 * alpha * beta / total)
    stirling = (
        (1 + 1 / (12 * alpha) + 1 / (288 * alpha * alpha))
        * (1 + 1 / (12 * beta) + 1 / (288 * b2))
        / (1 + 1 / (12 * total) + 1 / (288 * total * total))
    )
    axbx = alpha * (x - 1) + beta * x
    term1 = (2 * alpha * alpha * (x - 1) + alpha * beta * (x - 1) - x * b2) / (
        jnp.sqrt(2 * alpha / beta) * total**1.5 * axbx * axbx
    )
    term2 = 0.5 * jnp.log(alpha / (total * x))
    term3 = jnp.sqrt(8 * alpha * beta / total) / (beta * x + alpha * (x - 1))
    term4 = (beta * jnp.log(beta / (total * (1 - x))) + alpha * jnp.log(alpha / (total * x))) ** -1.5
    away = stirling * prefactor * (term1 + term2 * (term3 + jnp.where(x < mean, term4, -term4)))
    return jnp.where(near, at_mean, away)


def _dirichlet_grad_rational(x, alpha, total, dtype):
    """In double precision but for the two digammas, rounded to ``dtype`` as aten's are."""
    u = jnp.log(x)
    a = jnp.log(alpha) - u
    b = jnp.log(total) - a
    powers_u, powers_a = (1, u, u * u), (1, a, a * a)
    p, q = 0.0, 0.0
    for i in range(3):
        for j in range(3):
            ua = powers_u[i] * powers_a[j]
            cp, cq = _DIRICHLET_RATIONAL[0][i][j], _DIRICHLET_RATIONAL[1][i][j]
            p = p + ua * (cp[0] + b * (cp[1] + b * (cp[2] + b * cp[3])))
            q = q + ua * (cq[0] + b * (cq[1] + b * (cq[2] + b * cq[3])))
    digammas = _digamma_one(total.astype(dtype)).astype(x.dtype) - _digamma_one(alpha.astype(dtype)).astype(x.dtype)
    approx = x * digammas / (total - alpha)
    return p / q * approx


@lowering(aten._dirichlet_grad.default)
def dirichlet_grad(x, alpha, total):
    """Note [Dirichlet's reparameterized gradient]."""
    x, alpha, total = jnp.broadcast_arrays(x, alpha, total)
    wx, walpha, wtotal = (v.astype(_wide()) for v in (x, alpha, total))
    beta = total - alpha
    boundary = total * x * (1 - x)
    grad = jnp.where(
        (x <= 0.5) & (boundary < 2.5),
        _beta_grad_alpha_small(x, alpha, beta),
        jnp.where(
            (x >= 0.5) & (boundary < 0.75),
            -_beta_grad_beta_small(1 - x, beta, alpha),
            jnp.where(
                (alpha > 6) & (beta > 6),
                _beta_grad_alpha_mid(wx, walpha, wtotal - walpha).astype(x.dtype),
                _dirichlet_grad_rational(wx, walpha, wtotal, x.dtype).astype(x.dtype),
            ),
        ),
    )
    return grad
