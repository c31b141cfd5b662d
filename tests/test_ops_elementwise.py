"""Elementwise ops on ``tpu`` against CPU torch: values, dtypes, gradients.

One table of cases; hypothesis draws shapes (from a small set, so each program
shape compiles once), dtypes (mixed across operands, to exercise type
promotion) and values (with 0, -0, inf and nan).
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Callable

import attrs
import hypothesis
import pytest
import torch
import torch.nn.functional as F
from conftest import mode, run_both, tolerance
from hypothesis import given
from hypothesis import strategies as st

import lazytpu

aten = torch.ops.aten

F32, F64, I64, B = torch.float32, torch.float64, torch.int64, torch.bool
FLOATS = (F32, F64)
REALS = (F32, F64, I64)
ALL = (F32, F64, I64, B)
INTS = (I64, B)

# Shapes per operand count: broadcasting, 0-d and empty operands. The first
# entry broadcasts nothing (test_no_cpu_fallbacks uses it).
SHAPES = {
    1: ((2, 3), (), (0,)),
    2: (((2, 3), (2, 3)), ((2, 1), (1, 3)), ((), (2, 3)), ((0, 3), (3,))),
    3: (((2, 3), (2, 3), (2, 3)), ((2, 3), (3,), (2, 1)), ((), (2, 3), ()), ((0, 3), (3,), (1, 3))),
}
SAME_SHAPES = (((2, 3), (2, 3)), ((), ()), ((0,), (0,)))
EDGES = (0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 6.0)  # signed zeros, integers, ties
SPECIAL = (math.inf, -math.inf, math.nan)


@attrs.frozen
class Case:
    """``fn(*tensors, *scalars)``; ``dtypes`` is one tuple for all operands or one per operand."""

    fn: Callable
    arity: int = 1
    dtypes: tuple = FLOATS
    scalars: tuple = ((),)  # choices of the trailing non-tensor arguments
    grad: bool = True
    special: bool = True  # draw inf/nan
    nonzero: tuple = ()  # operands that must hold no integer 0 (integer division by zero raises)
    no_grad_operands: tuple = ()
    shapes: tuple | None = None  # instead of SHAPES[arity]
    mixed: bool = True  # operands may differ in dtype
    inference: bool = False  # CompositeImplicit ops reach the backend only with autograd off

    def call(self, *args):
        if self.inference:
            with torch.inference_mode():
                return self.fn(*args)
        return self.fn(*args)

    def shape_choices(self) -> tuple:
        if self.shapes is not None:
            return self.shapes
        return SHAPES[self.arity] if self.arity > 1 else tuple((s,) for s in SHAPES[1])

    def operand_dtypes(self) -> tuple:
        return self.dtypes if isinstance(self.dtypes[0], tuple) else (self.dtypes,) * self.arity


def scalars(*values) -> tuple:
    return tuple((v,) for v in values)


def _div(mode):
    return lambda x, y: torch.div(x, y, rounding_mode=mode)


def _compare_all(x, y):
    return x == y, x != y, x < y, x <= y, x > y, x >= y


CASES = {
    # arithmetic
    "add": Case(torch.add, 2, ALL),
    "add_alpha": Case(lambda x, y, a: torch.add(x, y, alpha=a), 2, FLOATS, scalars(2, -0.5)),
    "add_scalar": Case(lambda x, s: x + s, 1, ALL, scalars(2, -1.5, True)),
    "sub": Case(lambda x, y: torch.sub(x, y, alpha=2), 2, REALS),
    "sub_scalar": Case(lambda x, s: torch.sub(x, s, alpha=2), 1, REALS, scalars(3, 0.25)),
    "rsub": Case(lambda x, y: torch.rsub(x, y, alpha=3), 2, REALS),
    "rsub_scalar": Case(lambda x, s: s - x, 1, REALS, scalars(1, 2.5)),
    "mul": Case(torch.mul, 2, ALL),
    "mul_scalar": Case(aten.mul.Scalar, 1, ALL, scalars(3, -0.5, False)),
    "div": Case(torch.div, 2, ALL),
    "div_scalar": Case(lambda x, s: x / s, 1, ALL, scalars(3, -0.5)),
    "div_trunc": Case(_div("trunc"), 2, REALS, nonzero=(1,)),
    "div_floor": Case(_div("floor"), 2, REALS, nonzero=(1,)),
    "div_mode_scalar": Case(
        lambda x, s, m: (torch.div(x, s, rounding_mode=m), aten.div.Scalar_mode(x, s, rounding_mode=m)),
        1,
        REALS,
        tuple(itertools.product((3, -2, 0.75), ("trunc", "floor"))),
    ),
    "floor_divide": Case(torch.floor_divide, 2, REALS, grad=False, nonzero=(1,)),
    "floor_divide_scalar": Case(aten.floor_divide.Scalar, 1, REALS, scalars(3, -2, 0.75), grad=False),
    "remainder": Case(torch.remainder, 2, REALS, nonzero=(1,)),
    "remainder_scalar": Case(lambda x, s: torch.remainder(x, s), 1, REALS, scalars(3, -2, 1.5)),
    "scalar_remainder": Case(
        lambda x, s: torch.remainder(s, x), 1, REALS, scalars(3, -2, 1.5), grad=False, nonzero=(0,)
    ),
    "fmod": Case(torch.fmod, 2, REALS, nonzero=(1,)),
    "fmod_scalar": Case(lambda x, s: torch.fmod(x, s), 1, REALS, scalars(3, -2, 1.5)),
    "pow": Case(torch.pow, 2, FLOATS),
    "pow_int": Case(torch.pow, 2, ((I64,), (I64, B)), grad=False),
    "pow_tensor_scalar": Case(torch.pow, 1, FLOATS, scalars(2, 3, 0.5, -1, 2.5, 0)),
    "pow_int_scalar": Case(torch.pow, 1, (I64,), scalars(0, 1, 3, 1.5), grad=False),
    "pow_scalar_tensor": Case(lambda x, s: torch.pow(s, x), 1, REALS, scalars(2, 0.5, -3)),
    "lerp": Case(lambda x, y, w: torch.lerp(x, y, w), 2, FLOATS, scalars(0.25, 0.75, -1.5), mixed=False),
    "lerp_tensor": Case(torch.lerp, 3, FLOATS, mixed=False),
    "addcmul": Case(lambda x, y, z, v: torch.addcmul(x, y, z, value=v), 3, REALS, scalars(1, 2)),
    "addcdiv": Case(lambda x, y, z, v: torch.addcdiv(x, y, z, value=v), 3, FLOATS, scalars(1, -0.5)),
    "maximum": Case(torch.maximum, 2, ALL),
    "minimum": Case(torch.minimum, 2, ALL),
    "clamp": Case(
        lambda x, lo, hi: torch.clamp(x, lo, hi),
        1,
        REALS,
        tuple(itertools.product((None, -1, -0.5), (None, 2, 0.5)))[1:],
    ),
    "clamp_tensor": Case(
        torch.clamp,
        3,
        REALS,
        shapes=(  # autograd cannot reduce a grad to a smaller self
            ((2, 3), (2, 3), (2, 3)),
            ((2, 3), (3,), (2, 1)),
            ((2, 3), (), (3,)),
            ((0, 3), (3,), (1, 3)),
        ),
    ),
    "clamp_min_max": Case(
        lambda x, y: (
            torch.clamp_min(x, y),
            torch.clamp_max(x, y),
            torch.clamp(x, min=y),
            torch.clamp_min(x, 0.5),
            torch.clamp_max(x, -1),
        ),
        2,
        REALS,
    ),
    # unary math
    **{
        name: Case(getattr(torch, name), 1, ALL)
        for name in "exp exp2 expm1 log log1p log2 sqrt rsqrt reciprocal sin cos tanh sigmoid erf".split()
    },
    "neg": Case(torch.neg, 1, REALS),
    "abs": Case(torch.abs, 1, REALS),
    "sign": Case(torch.sign, 1, ALL),
    "sgn": Case(torch.sgn, 1, ALL),
    "rounding": Case(lambda x: (torch.floor(x), torch.ceil(x), torch.trunc(x), torch.round(x)), 1, REALS),
    "round_decimals": Case(lambda x, d: torch.round(x * 11, decimals=d), 1, FLOATS, scalars(1, -1), grad=False),
    "nan_to_num": Case(lambda x, n: torch.nan_to_num(x, *n), 1, REALS, scalars((), (1.5,), (0.0, 100.0, -100.0))),
    "predicates": Case(
        lambda x: (
            torch.isnan(x),
            torch.isinf(x),
            torch.isfinite(x),
            torch.isposinf(x),
            torch.isneginf(x),
            torch.signbit(x),
        ),
        1,
        ALL,
        grad=False,
    ),
    # comparisons and logic
    "compare": Case(_compare_all, 2, ALL, grad=False),
    "compare_scalar": Case(_compare_all, 1, ALL, scalars(0, 1.5, True), grad=False),
    "logical": Case(
        lambda x, y: (torch.logical_and(x, y), torch.logical_or(x, y), torch.logical_xor(x, y), torch.logical_not(x)),
        2,
        ALL,
        grad=False,
    ),
    "bitwise": Case(lambda x, y: (x & y, x | y, x ^ y, ~x), 2, INTS, grad=False),
    "bitwise_scalar": Case(
        lambda x, s: (
            x & s,
            x | s,
            x ^ s,
            aten.bitwise_and.Scalar_Tensor(s, x),
            aten.bitwise_or.Scalar_Tensor(s, x),
            aten.bitwise_xor.Scalar_Tensor(s, x),
        ),
        1,
        INTS,
        scalars(3, -2, True),
        grad=False,
    ),
    "where": Case(lambda c, x, y: torch.where(c, x, y), 3, ((B,), ALL, ALL)),
    "where_scalar": Case(
        lambda c, x, s: (torch.where(c, x, s), torch.where(c, s, x), torch.where(c, s, 2)),
        2,
        ((B,), REALS),
        scalars(-1, 0.5),
    ),
    "masked_fill": Case(lambda x, m, v: x.masked_fill(m, v), 2, (ALL, (B,)), scalars(-1, 2.5, True)),
    "masked_fill_tensor": Case(
        lambda x, m, v: x.masked_fill(m, v),
        3,
        (FLOATS, (B,), FLOATS),
        no_grad_operands=(2,),
        shapes=(((2, 3), (2, 3), ()), ((2, 3), (3,), ()), ((), (), ()), ((0, 3), (3,), ())),
    ),
    # activations (and, through grad=True, their backward ops)
    "relu": Case(torch.relu, 1, REALS),
    "gelu": Case(lambda x, a: F.gelu(x, approximate=a), 1, FLOATS, scalars("none", "tanh")),
    "silu": Case(F.silu, 1, FLOATS),
    "softplus": Case(lambda x, b: F.softplus(x, beta=b[0], threshold=b[1]), 1, FLOATS, scalars((1, 20), (2.0, 3.0))),
    "leaky_relu": Case(lambda x, s: F.leaky_relu(x, s), 1, FLOATS, scalars(0.01, 0.2)),
    "elu": Case(lambda x, a: aten.elu(x, *a), 1, FLOATS, scalars((1.0,), (0.5, 2.0, 1.5))),  # alpha, scale, input_scale
    "selu": Case(F.selu, 1, FLOATS),
    "hardtanh": Case(lambda x, lo: F.hardtanh(x, lo, 1.5), 1, FLOATS, scalars(-1.0, -0.25)),
    "threshold": Case(lambda x, t: F.threshold(x, t, -3.0), 1, FLOATS, scalars(0.5, -1)),
    # backward ops called directly: autograd does not emit all of them (silu's
    # backward under grad mode is a composite; elu's is_result form needs elu_)
    **{
        name: Case(fn, 2, FLOATS, args, grad=False, mixed=False, shapes=SAME_SHAPES)
        for name, (fn, args) in {
            "sigmoid_backward": (aten.sigmoid_backward, ((),)),
            "tanh_backward": (aten.tanh_backward, ((),)),
            "threshold_backward": (aten.threshold_backward, scalars(0.5, -1)),
            "gelu_backward": (lambda g, x, a: aten.gelu_backward(g, x, approximate=a), scalars("none", "tanh")),
            "softplus_backward": (aten.softplus_backward, ((1, 20), (2.0, 3.0))),
            "leaky_relu_backward": (aten.leaky_relu_backward, ((0.01, False), (0.2, True))),
            "elu_backward": (
                lambda g, x, *a: aten.elu_backward(g, *a, x),
                ((1.0, 1.0, 1.0, False), (0.5, 2.0, 1.5, True)),
            ),
            "hardtanh_backward": (aten.hardtanh_backward, ((-1.0, 1.0), (-0.25, 1.5))),
        }.items()
    },
    # CompositeImplicit ops: with autograd on, torch decomposes them before the backend sees them
    "composites": Case(
        lambda x, y: (
            torch.where(x > 0, 1.5, y),
            torch.where(x > 0, y, -2),
            torch.where(x > 0, 1.0, 2),
            torch.isfinite(x),
            torch.conj_physical(x),
        ),
        2,
        REALS,
        grad=False,
        inference=True,
    ),
    "silu_backward": Case(aten.silu_backward, 2, FLOATS, grad=False, mixed=False, shapes=SAME_SHAPES, inference=True),
}


@st.composite
def tensors(draw, shape: tuple, dtype: torch.dtype, *, special: bool, nonzero: bool) -> torch.Tensor:
    """Dense random values from a drawn seed, with drawn edge values planted
    at drawn positions (hypothesis alone mostly draws zeros in few examples)."""
    n = math.prod(shape)
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1), label="seed"))
    if dtype is B:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        # XLA flushes subnormals to zero (as TPUs do): keep values well inside the normal range
        values = (torch.randn(n, generator=gen, dtype=F64) * 3).to(dtype)
        edges = EDGES + (SPECIAL if special else ())
    else:
        values = torch.randint(-9, 10, (n,), generator=gen, dtype=dtype)
        edges = (0, 1, -1, 9, -9)
    if n:
        for i, v in draw(st.lists(st.tuples(st.integers(0, n - 1), st.sampled_from(edges)), max_size=n), label="edges"):
            values[i] = v
    if nonzero and not dtype.is_floating_point:
        values[values == 0] = 1
    return values.reshape(shape)


def draw_signature(data, case: Case) -> tuple[list, tuple]:
    """(shape, dtype) per tensor operand, and the non-tensor arguments: what
    decides the compiled program."""
    shapes = data.draw(st.sampled_from(case.shape_choices()), label="shapes")
    dtypes = []
    for i, options in enumerate(case.operand_dtypes()[: len(shapes)]):
        dtypes.append(data.draw(st.sampled_from(options), label=f"dtype{i}") if case.mixed or not i else dtypes[0])
    return list(zip(shapes, dtypes)), data.draw(st.sampled_from(case.scalars), label="scalars")


def draw_inputs(data, case: Case, signature: tuple[list, tuple], *, grad: bool) -> list:
    operands, scalars = signature
    inputs = []
    for i, (shape, dtype) in enumerate(operands):
        t = data.draw(tensors(shape, dtype, special=case.special and not grad, nonzero=i in case.nonzero))
        if grad and case.grad and dtype.is_floating_point and i not in case.no_grad_operands:
            t.requires_grad_(True)
        inputs.append(t)
    return inputs + list(scalars)


# Expected failures, with the reason: (test, case) -> reason. Empty now; an
# entry would leave its case out of ``test`` (and should get a strict xfail test).
XFAIL: dict[tuple[str, str], str] = {}


def cases(test: str, names) -> list:
    return sorted(n for n in names if (test, n) not in XFAIL)


# Each distinct signature (op, shapes, dtypes) compiles a program (~30-50 ms):
# a few signatures per op and mode, each run on several drawn values, keep the
# file fast; the table's breadth does the rest.
_HEALTH = [hypothesis.HealthCheck.function_scoped_fixture]
VALUE_SETTINGS = hypothesis.settings(max_examples=5, suppress_health_check=_HEALTH)
GRAD_SETTINGS = hypothesis.settings(max_examples=3, suppress_health_check=_HEALTH)
VALUES_PER_PROGRAM = 3


@pytest.mark.parametrize("name", cases("values", CASES))
@VALUE_SETTINGS
@given(data=st.data())
def test_matches_cpu(name, eager_mode, data):
    case = CASES[name]
    signature = draw_signature(data, case)
    for _ in range(VALUES_PER_PROGRAM):
        run_both(case.call, *draw_inputs(data, case, signature, grad=False), mode_name=eager_mode)


@pytest.mark.parametrize("name", cases("grad", (name for name, case in CASES.items() if case.grad)))
@GRAD_SETTINGS
@given(data=st.data())
def test_gradients_match_cpu(name, eager_mode, data):
    case = CASES[name]
    signature = draw_signature(data, case)
    floats = [dtype for _, dtype in signature[0] if dtype.is_floating_point]
    hypothesis.assume(floats)
    # a float64 leaf's gradient may flow through float32 math: the loosest tolerance
    tol = max((tolerance(d) for d in floats), key=lambda t: t["rtol"])
    for _ in range(VALUES_PER_PROGRAM):
        run_both(case.call, *draw_inputs(data, case, signature, grad=True), mode_name=eager_mode, grad=True, **tol)


def _grad_inputs(case: Case) -> list:
    """Same-shape inputs (no broadcasting reductions in backward)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for i, (shape, choices) in enumerate(zip(case.shape_choices()[0], case.operand_dtypes())):
        dtype = choices[0]
        t = torch.randn(shape, generator=gen).to(dtype) if dtype is not B else torch.rand(shape, generator=gen) > 0.5
        if dtype.is_floating_point and case.grad and i not in case.no_grad_operands:
            t.requires_grad_(True)
        out.append(t)
    return out


def check_no_fallbacks(case: Case) -> None:
    """Forward and backward (same shapes, explicit seeds) run without CPU fallback."""
    inputs = [t.detach().to("tpu").requires_grad_(t.requires_grad) for t in _grad_inputs(case)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lazytpu.sync()
        before = lazytpu.metrics.snapshot()["cpu_fallbacks"]
        out = case.call(*inputs, *case.scalars[-1])
        outs = [o for o in (out if isinstance(out, tuple) else (out,)) if o.requires_grad]
        leaves = [t for t in inputs if t.requires_grad]
        if outs and leaves:
            seeds = [torch.ones(o.shape, dtype=o.dtype).to("tpu") for o in outs]
            torch.autograd.grad(outs, leaves, seeds, allow_unused=True)
        lazytpu.sync()
        after = lazytpu.metrics.snapshot()["cpu_fallbacks"]
    assert {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)} == {}


@pytest.mark.parametrize("name", cases("fallbacks", CASES))
def test_no_cpu_fallbacks(name):
    check_no_fallbacks(CASES[name])


# In-place, out= and _foreach_ forms are derived by the dispatcher from the
# functional rules above; one fixed example each checks the wiring.
DERIVED = {
    "add_": lambda x, y, m: x.clone().add_(y, alpha=0.5),
    "sub_": lambda x, y, m: x.clone().sub_(2.0),
    "mul_": lambda x, y, m: x.clone().mul_(y),
    "div_": lambda x, y, m: x.clone().div_(y, rounding_mode="floor"),
    "pow_": lambda x, y, m: x.clone().abs_().pow_(1.5),
    "clamp_": lambda x, y, m: x.clone().clamp_(-0.5, 0.5),
    "masked_fill_": lambda x, y, m: x.clone().masked_fill_(m, -1.0),
    "relu_": lambda x, y, m: torch.relu_(x.clone()),
    "sigmoid_": lambda x, y, m: x.clone().sigmoid_(),
    "lerp_": lambda x, y, m: x.clone().lerp_(y, 0.3),
    "addcmul_": lambda x, y, m: x.clone().addcmul_(y, y, value=2.0),
    "leaky_relu_": lambda x, y, m: F.leaky_relu(x.clone(), 0.2, inplace=True),
    "eq_": lambda x, y, m: x.clone().eq_(y),
    "out": lambda x, y, m: torch.mul(x, y, out=torch.empty_like(x)),
    "out_int_to_float": lambda x, y, m: torch.div(m.long(), 2, out=torch.empty_like(x)),
    "foreach": lambda x, y, m: torch._foreach_add([x, y], [y, y], alpha=2.0) + torch._foreach_mul([x, y], 3.0),
    "foreach_": lambda x, y, m: (xs := [x.clone(), y.clone()], torch._foreach_clamp_min_(xs, 0.1), xs)[-1],
}


@pytest.mark.parametrize("name", sorted(DERIVED))
def test_derived_forms(name, eager_mode):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 3, generator=gen), torch.randn(3, generator=gen)
    run_both(DERIVED[name], x, y.expand(2, 3).contiguous(), x > 0, mode_name=eager_mode)


_HALF_SCALAR_OPS = {
    "add": lambda x, s: x + s,
    "sub": lambda x, s: x - s,
    "rsub": lambda x, s: s - x,
    "add_alpha": lambda x, s: torch.add(x, x, alpha=s),
    "fmod": lambda x, s: torch.fmod(x, s),
    "remainder": lambda x, s: x % s,
    "pow": lambda x, s: x**s,
    "rpow": lambda x, s: s**x,
    "atan2_0d": lambda x, s: torch.atan2(x, torch.tensor(s, device=x.device)),
    "eq": lambda x, s: x == torch.tensor(s, dtype=x.dtype).item(),
    "lt": lambda x, s: x < s,
    "xlogy": lambda x, s: torch.xlogy(x, s),  # and the log is rounded to half before the product
    "xlog1py_tensor": lambda x, s: torch.special.xlog1py(x, torch.full_like(x, s)),
    "mul": lambda x, s: x * s,  # these read the number unrounded
    "div": lambda x, s: x / s,
    "floor_divide": lambda x, s: x // s,
    "lerp": lambda x, s: torch.lerp(x, 2 * x, s),
}


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
@pytest.mark.parametrize("name", sorted(_HALF_SCALAR_OPS))
def test_half_operand_with_a_python_number_as_cpu(name, dtype):
    """See Note [Scalars of half operands]: bit-equal to CPU (``fmod(half, 0.1)``
    was up to 20% off, ``half + 2.3`` one ulp in a fifth of the elements)."""
    fn = _HALF_SCALAR_OPS[name]
    x = (torch.rand(512, generator=torch.Generator().manual_seed(0)) * 8 + 0.1).to(dtype)
    for s in (2.3, 0.1, 1.7):
        expected = fn(x, s)
        assert torch.equal(fn(x.to("tpu"), s).cpu(), expected), s


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16))
@pytest.mark.parametrize("exponent", (2, 3, 4, -2, -1))
def test_half_integer_powers_round_once_as_cpu(dtype, exponent):
    """CPU computes ``float16 ** 3`` in float32 and rounds once, and ``bfloat16 ** 3``
    as two bfloat16 products; tpu multiplied in the storage dtype. Int or float exponent."""
    x = (torch.rand(4096, generator=torch.Generator().manual_seed(1)) * 8 + 0.1).to(dtype)
    for e in (exponent, float(exponent)):
        assert torch.equal((x.to("tpu") ** e).cpu(), x**e), e


@pytest.mark.parametrize("dtype", (torch.complex64, torch.complex128))
def test_complex_powers_of_zero_and_exact_squares(dtype):
    """``0 ** z`` is 0 for Re(z) > 0 (XLA gave nan); a tensor exponent gives CPU's
    ``exp(z * log(0))`` values; ``(1+1j) ** 2.0`` is 2j exactly, as CPU's multiply."""
    base = torch.tensor([0, 1 + 1j, -2, 0], dtype=dtype)
    for exponent in (0.5 + 0.2j, 2.0, 3.0, -2.0, 0.5, 1j):
        torch.testing.assert_close((base.to("tpu") ** exponent).cpu(), base**exponent, equal_nan=True)
    zeros = torch.zeros(5, dtype=dtype)
    exponents = torch.tensor([0.5 + 0.2j, 0, -1, 1j, -0.5 - 1j], dtype=dtype)
    torch.testing.assert_close((zeros.to("tpu") ** exponents.to("tpu")).cpu(), zeros**exponents, equal_nan=True)
    assert (base.to("tpu") ** 2.0).cpu()[1] == 2j


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64, torch.float16, torch.bfloat16))
def test_sign_of_negative_zero_and_nan_is_positive_zero(dtype):
    """CPU's ``(0 < x) - (x < 0)``: ``sign(-0.0)`` and ``sign(nan)`` are +0.0 (tpu gave -0.0 for -0.0)."""
    x = torch.tensor([0.0, -0.0, float("nan"), -3.0, 2.0, float("-inf")], dtype=dtype)
    actual = torch.sign(x.to("tpu")).cpu()
    assert torch.equal(actual, torch.sign(x)) and not torch.signbit(actual[:3]).any()


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_square_roots_divide_as_on_cpu(dtype, eager_mode):
    """(Note [Square roots on XLA:CPU]) XLA rewrote ``a / sqrt(b)`` as ``a * rsqrt(b)``
    and its rsqrt is not CPU's ``1 / sqrt`` (36-40% of results an ulp off): rsqrt,
    ``pow(x, -0.5)``, RMSNorm's ``x * rsqrt(...)`` and a division by a square root in
    one program are bit-equal with CPU's (the division's root taken correctly rounded:
    CPU's own ``sqrt`` kernel is an ulp off on 0.7% of float32 inputs)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(20000, generator=gen, dtype=dtype) + 0.5
    b = torch.rand(20000, generator=gen, dtype=dtype) * 100 + 0.1
    exact_sqrt = torch.from_numpy(b.numpy() ** 0.5) if dtype is torch.float64 else torch.sqrt(b.double()).float()
    got = {
        "rsqrt": torch.rsqrt(b.to("tpu")),
        "pow": b.to("tpu").pow(-0.5),
        "rms": a.to("tpu") * torch.rsqrt(b.to("tpu") + 1e-6),
        "divide": a.to("tpu") / torch.sqrt(b.to("tpu")),
    }
    want = {"rsqrt": torch.rsqrt(b), "pow": torch.pow(b, -0.5), "rms": a * torch.rsqrt(b + 1e-6)}
    want["divide"] = a / exact_sqrt
    for name, value in got.items():
        assert torch.equal(value.cpu(), want[name]), name


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64, torch.float16, torch.bfloat16))
def test_division_by_a_number_or_a_broadcast_divisor_is_cpus_quotient(dtype, eager_mode):
    """(Note [Exact quotients]) XLA multiplied by the reciprocal of a scalar, constant or
    broadcast divisor: float32 quotients were an ulp off CPU's on about a third of elements
    (``(1 - 50) / 49`` was -0.99999994, whose ``.long()`` is 0), float64's too (also by an
    expanded divisor, and in ``addcdiv``)."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(4, 3000, generator=gen) * 100).to(dtype)
    row = (torch.rand(3000, generator=gen) + 0.5).to(dtype)
    cases = {
        "number": lambda t, r: t / 7.0,
        "zero_dim": lambda t, r: t / torch.tensor(49.0, dtype=dtype, device=t.device),
        "row": lambda t, r: t / r,
        "expanded": lambda t, r: t / r[:4, None].expand(4, 3000),
        "addcdiv": lambda t, r: torch.addcdiv(t, t, r, value=0.5),
        "mean": lambda t, r: t.mean(1),
        "truncated": lambda t, r: (torch.arange(-60, 60, device=t.device) / 49).long(),
    }
    for name, fn in cases.items():
        want = fn(x, row)
        got = fn(x.to("tpu"), row.to("tpu")).cpu()
        if name == "mean":  # the sum's order is XLA's: its quotient is exact, the sum not always CPU's
            torch.testing.assert_close(got, want)
        else:
            assert torch.equal(got, want), (name, (got != want).sum().item())


@pytest.mark.parametrize(
    "name",
    ["polygamma_of_huge_order", "round_to_huge_decimals", "round_to_huge_negative_decimals", "var_of_nan_correction"],
)
def test_numbers_past_the_host_floats_range_give_cpus_values(name, eager_mode):
    """``polygamma(2**40, x)``'s factorial and ``round(x, decimals=2**40)``'s scale overflow a Python
    float: CPU's ``std::exp`` and ``std::pow`` give inf (so -inf and NaN), the lowering raised
    OverflowError. A NaN correction: CPU's divisor ``max(0, n - nan)`` is 0 (inf), ``jnp.maximum``'s NaN."""
    cases = {
        "polygamma_of_huge_order": lambda t: torch.polygamma(2**40, t),
        "round_to_huge_decimals": lambda t: torch.round(t, decimals=2**40),
        "round_to_huge_negative_decimals": lambda t: torch.round(t, decimals=-(2**40)),
        "var_of_nan_correction": lambda t: torch.var(t, dim=0, correction=float("nan")),
    }
    x = torch.tensor([[0.5, 1.0, 3.0], [2.0, 7.5, 40.0]])
    with mode(eager_mode):
        got = cases[name](x.to("tpu")).cpu()
    torch.testing.assert_close(got, cases[name](x), equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.float32, torch.complex64])
@pytest.mark.parametrize("exponent", [True, False])
def test_a_bool_exponent_is_cpus(dtype, exponent, eager_mode):
    """CPU's ``pow`` copies its input for an exponent of True and fills ones for False, before
    its dtype check: a bool tensor stays bool (the meta kernel made it int64, and ``pow_``
    and ``_foreach_pow_`` refused the cast back). PyTorch's test_foreach.py on tpu."""
    cpu = torch.tensor([0, 1, 3], dtype=torch.float32).to(dtype)
    with mode(eager_mode):
        tpu = cpu.to("tpu")
        results = [torch.pow(tpu, exponent), tpu.clone().pow_(exponent), torch._foreach_pow([tpu], exponent)[0]]
        inplace = [tpu.clone()]
        torch._foreach_pow_(inplace, exponent)
        for got in [*results, inplace[0]]:
            want = torch.pow(cpu, exponent)
            assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
