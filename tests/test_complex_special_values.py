"""Complex unary functions on ``tpu`` give CPU torch's values on special values and
branch cuts: signed zeros, infinities and NaNs (Note [Complex special values])."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

INF, NAN = math.inf, math.nan
PARTS = (0.0, -0.0, 1.5, -2.0, INF, -INF, NAN)
# the sides of the cuts: on the real axis beyond +-1 (asin, acos, atanh), left of 0 (sqrt, log,
# acosh), on the imaginary axis beyond +-i (asinh, atan), and at the branch points themselves
CUTS = [complex(a, b) for a, b in itertools.product((2.0, -2.0, 1.5, -1.5, 1.0, -1.0, 0.5), (0.0, -0.0))]
CUTS += [complex(b, a) for a, b in itertools.product((2.0, -2.0, 1.5, -1.5, 1.0, -1.0, 0.5), (0.0, -0.0))]
SPECIAL = [complex(a, b) for a, b in itertools.product(PARTS, PARTS)] + CUTS
# CPU torch runs the tail of a tensor that does not fill its vectors through the scalar kernel,
# which differs from the vectorized one for sgn (an all-vector length reads the same everywhere)
SPECIAL += SPECIAL[: -len(SPECIAL) % 16]

FUNCTIONS = {
    name: getattr(torch, name)
    for name in (
        "exp",
        "exp2",
        "expm1",
        "log",
        "log2",
        "log10",
        "log1p",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "sigmoid",
        "sgn",
        "sin",
        "cos",
        "tan",
        "sinh",
        "cosh",
        "tanh",
        "asin",
        "acos",
        "atan",
        "asinh",
        "acosh",
        "atanh",
    )
}
DTYPES = (torch.complex64, torch.complex128)
# relative, on finite values; absolute up to the smallest normal number, as XLA:CPU flushes
# subnormal results to zero
TOLERANCE = {torch.complex64: dict(rtol=1e-6, atol=1.2e-38), torch.complex128: dict(rtol=1e-12, atol=2.3e-308)}


def _random(dtype, n=64):
    gen = torch.Generator().manual_seed(0)
    scales = (1.0, 3.0, 30.0, 1e-3, 1e3, 1e-20, 1e20)
    parts = [torch.randn(2, n, dtype=torch.float64, generator=gen) * s for s in scales]
    x = torch.cat(parts, 1)
    return torch.complex(x[0], x[1]).to(dtype)


def _assert_same_values(inputs, actual, expected, rtol):
    """Each part equal within ``rtol`` (NaN equals NaN), and of the same sign where it is not NaN
    (part by part: a complex difference with an infinite part is NaN)."""
    torch.testing.assert_close(
        torch.view_as_real(actual), torch.view_as_real(expected), equal_nan=True, rtol=rtol, atol=0
    )
    wrong = torch.zeros(len(inputs), dtype=torch.bool)
    for part in (torch.real, torch.imag):
        wrong |= (part(actual).signbit() != part(expected).signbit()) & ~part(expected).isnan()
    bad = [(complex(z), complex(a), complex(e)) for z, a, e, w in zip(inputs, actual, expected, wrong) if w]
    assert not bad, f"(input, tpu, cpu) with a part of another sign: {bad}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_special_values_match_cpu(name, dtype):
    z = torch.tensor(SPECIAL, dtype=dtype)
    fn = FUNCTIONS[name]
    _assert_same_values(z, fn(z.to("tpu")).cpu(), fn(z), TOLERANCE[dtype]["rtol"])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", FUNCTIONS)
def test_finite_values_match_cpu(name, dtype):
    z = _random(dtype)
    fn = FUNCTIONS[name]
    torch.testing.assert_close(fn(z.to("tpu")).cpu(), fn(z), equal_nan=True, **TOLERANCE[dtype])


@pytest.mark.parametrize("name", ["sqrt", "log", "asin", "acos", "acosh", "atanh"])
def test_conj_picks_lower_side_of_cut(name):
    # conj() of a real-valued complex tensor gives -0.0 imaginary parts: the lower side of the cut
    z = torch.tensor([-2.0, -0.5, 2.0, 1.5], dtype=torch.complex64)
    fn = FUNCTIONS[name]
    _assert_same_values(z.conj(), fn(z.to("tpu").conj()).cpu(), fn(z.conj()), 1e-6)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_abs_of_an_infinite_part_is_infinite(dtype):
    """``abs(inf + nanj)`` is inf, as CPU's hypot gives (it was NaN)."""
    z = torch.tensor(SPECIAL, dtype=dtype)
    torch.testing.assert_close(z.to("tpu").abs().cpu(), z.abs(), equal_nan=True, rtol=TOLERANCE[dtype]["rtol"], atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_division_matches_cpu(dtype):
    """``z / w`` divides as c10::complex (Smith's algorithm): a divisor with
    infinite parts gives CPU's NaN or signed zeros (XLA's gave 0), a zero one
    CPU's infinities and NaNs."""
    parts = torch.tensor([complex(a, b) for a, b in itertools.product(PARTS, PARTS)], dtype=dtype)
    z, w = parts.repeat_interleave(len(parts)), parts.repeat(len(parts))
    _assert_same_values(z, (z.to("tpu") / w.to("tpu")).cpu(), z / w, TOLERANCE[dtype]["rtol"])
    x, y = _random(dtype), _random(dtype).flip(0)
    torch.testing.assert_close((x.to("tpu") / y.to("tpu")).cpu(), x / y, **TOLERANCE[dtype])
