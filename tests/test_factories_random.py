"""Factories match CPU torch exactly; random ops have the right shape, dtype,
range and moments, reproduce under ``torch.manual_seed`` and never fall back.
"""

from __future__ import annotations

import collections
import re
import warnings

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from conftest import assert_close, mode, no_fallback

import lazytpu
from lazytpu.lowering import factories

fixture_settings = hypothesis.settings(suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])


def _fallbacks() -> collections.Counter:
    return collections.Counter(lazytpu.metrics.snapshot()["cpu_fallbacks"])


def compare_factory(make, mode_name: str, values: bool = True) -> torch.Tensor:
    """``make(device)`` on ``tpu`` equals it on CPU (values, dtype, shape); no fallback."""
    expected = make("cpu")
    before = _fallbacks()
    with mode(mode_name):
        actual = make("tpu")
        assert actual.device.type == "tpu"
        host = actual.cpu()
    assert _fallbacks() == before, f"cpu fallbacks: {_fallbacks() - before}"
    assert (host.shape, host.dtype) == (expected.shape, expected.dtype)
    if values:
        assert_close(host, expected)
    return actual


# -- factories -----------------------------------------------------------------

DTYPES = (None, torch.float32, torch.float64, torch.int64, torch.bool)
SIZES = ((), (0,), (2, 3), (1, 0, 2))

FACTORIES = {
    "zeros": lambda size, dt, d: torch.zeros(size, dtype=dt, device=d),
    "ones": lambda size, dt, d: torch.ones(size, dtype=dt, device=d),
    "full_float": lambda size, dt, d: torch.full(size, 2.5, dtype=dt, device=d),
    "full_int": lambda size, dt, d: torch.full(size, 2**40 if dt in (None, torch.int64) else 7, dtype=dt, device=d),
    "full_bool": lambda size, dt, d: torch.full(size, True, dtype=dt, device=d),
    "zeros_like": lambda size, dt, d: torch.zeros_like(torch.ones(size, device=d), dtype=dt),
    "ones_like": lambda size, dt, d: torch.ones_like(torch.ones(size, device=d, dtype=torch.int64), dtype=dt),
    "full_like": lambda size, dt, d: torch.full_like(torch.ones(size, device=d), 3, dtype=dt),
    "new_zeros": lambda size, dt, d: torch.ones(1, device=d).new_zeros(size, dtype=dt),
    "new_ones": lambda size, dt, d: torch.ones(1, device=d).new_ones(size, dtype=dt),
    "new_full": lambda size, dt, d: torch.ones(1, device=d, dtype=torch.int64).new_full(size, 4, dtype=dt),
    "fill_": lambda size, dt, d: torch.ones(size, dtype=dt, device=d).fill_(-1.5),
    "zero_": lambda size, dt, d: torch.ones(size, dtype=dt, device=d).zero_(),
    "zeros_out": lambda size, dt, d: torch.zeros(size, out=torch.empty(0, dtype=dt or torch.float32, device=d)),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
@fixture_settings
@hypothesis.given(size=st.sampled_from(SIZES), dtype=st.sampled_from(DTYPES))
def test_constant_factory_matches_cpu(name, size, dtype, eager_mode):
    compare_factory(lambda d: FACTORIES[name](size, dtype, d), eager_mode)


def test_fill_with_tensor(eager_mode):
    compare_factory(lambda d: torch.ones(2, 3, device=d).fill_(torch.ones((), device=d) * 3), eager_mode)


@pytest.mark.parametrize("like", [False, True])
@pytest.mark.parametrize("dtype", [None, torch.int64, torch.float64])
def test_empty_shape_and_dtype(like, dtype, eager_mode):
    def make(d):
        if like:
            return torch.empty_like(torch.ones(2, 3, device=d), dtype=dtype)
        return torch.empty(2, 3, dtype=dtype, device=d)

    compare_factory(make, eager_mode, values=False)


BOUNDS = st.sampled_from([0, 1, 3, -2, 10, 0.5, -1.25, 2.75])
STEPS = st.sampled_from([1, 2, -1, 3, 0.25, -0.5, 0.1])


@fixture_settings
@hypothesis.given(
    start=BOUNDS, end=BOUNDS, step=STEPS, dtype=st.sampled_from((None, torch.float32, torch.float64, torch.int64))
)
def test_arange_matches_cpu(start, end, step, dtype, eager_mode):
    try:
        torch.arange(start, end, step, dtype=dtype)
    except (RuntimeError, ValueError):
        hypothesis.assume(False)  # bounds inconsistent with the step sign
    compare_factory(lambda d: torch.arange(start, end, step, dtype=dtype, device=d), eager_mode)


@pytest.mark.parametrize("args", [(5,), (2, 7), (0,), (3.5,), (1, 2, 0.3)], ids=str)
def test_arange_overloads_match_cpu(args, eager_mode):
    compare_factory(lambda d: torch.arange(*args, device=d), eager_mode)


def test_arange_is_one_recorded_op_of_torchs_dtype():
    """``torch.arange(..., device="tpu")`` records one op, not torch's empty, ``arange.out``,
    resize and copy; an int and a float bound of the same value give torch's two dtypes
    whichever comes first, and bad arguments raise CPU torch's errors."""
    for args in ((5.0,), (5,), (0, 5.0), (0, 5), (0, 5, 1.0), (0, 5, 1)):
        lazytpu.metrics.reset()
        got = torch.arange(*args, device="tpu")
        assert lazytpu.metrics.snapshot()["ops_recorded"] == 1, args
        want = torch.arange(*args)
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want), args
    for bad in ((0, 10, 0), (10, 0, 1), (0, float("inf"))):
        with pytest.raises(RuntimeError) as cpu:
            torch.arange(*bad)
        with pytest.raises(RuntimeError, match=re.escape(str(cpu.value))):
            torch.arange(*bad, device="tpu")


@pytest.mark.parametrize("args", [(3,), (2, 4), (0,), (3, 0)], ids=str)
@pytest.mark.parametrize("dtype", [None, torch.int64, torch.bool])
def test_eye_matches_cpu(args, dtype, eager_mode):
    compare_factory(lambda d: torch.eye(*args, dtype=dtype, device=d), eager_mode)


@pytest.mark.parametrize("value", [3, -2.5, True])
@pytest.mark.parametrize("dtype", [None, torch.float64, torch.int64])
def test_scalar_tensor_matches_cpu(value, dtype, eager_mode):
    compare_factory(lambda d: torch.scalar_tensor(value, dtype=dtype, device=d), eager_mode)


LINSPACE = [(0, 1, 5), (-3.5, 10, 7), (1, 0, 11), (2, 2, 1), (0, 5, 0), (0, 1, 100), (-7, 20, 6)]


@pytest.mark.parametrize("args", LINSPACE, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_linspace_logspace_rules_match_cpu(args, dtype):
    # The rules are unreachable on device for now (see test_linspace_on_device): run them directly.
    for torch_fn, rule, extra in (
        (torch.linspace, factories.linspace, {}),
        (torch.logspace, factories.logspace, {"base": 2.0}),
    ):
        expected = torch_fn(*args, dtype=dtype, **extra)
        actual = np.array(rule(*args, *extra.values(), dtype=dtype).astype(expected.numpy().dtype))
        assert_close(torch.from_numpy(actual), expected)


def test_linspace_on_device(eager_mode):
    compare_factory(lambda d: torch.linspace(0, 1, 5, device=d), eager_mode)


@pytest.mark.parametrize(
    "args, dtype",
    [((8,), None), ((8, False), None), ((9, True, 5.0), None), ((1,), None), ((0,), None), ((7,), torch.float64)]
    + [((6, True, 3.0), torch.float16), ((6,), torch.bfloat16)],
    ids=str,
)
def test_kaiser_window_matches_cpu(args, dtype, eager_mode):
    """torch's kernel for every backend calls a CPU/CUDA-only stub (an internal assert on tpu before)."""
    compare_factory(lambda d: torch.kaiser_window(*args, dtype=dtype, device=d), eager_mode)


@pytest.mark.parametrize("args, dtype", [((-1,), None), ((4,), torch.int64)], ids=str)
def test_kaiser_window_errors_are_cpus(args, dtype):
    with pytest.raises(RuntimeError) as cpu:
        torch.kaiser_window(*args, dtype=dtype)
    with pytest.raises(RuntimeError) as tpu:
        torch.kaiser_window(*args, dtype=dtype, device="tpu")
    assert str(tpu.value) == str(cpu.value)


# -- random ----------------------------------------------------------------------

N = 20_000

# name -> (make on tpu, expected dtype, low, high, mean, std): the values must
# lie in [low, high] and their moments match (None: not checked).
RANDOM = {
    "randn": (lambda: torch.randn(N, device="tpu"), torch.float32, None, None, 0.0, 1.0),
    "randn_f64": (lambda: torch.randn(N, dtype=torch.float64, device="tpu"), torch.float64, None, None, 0.0, 1.0),
    "rand": (lambda: torch.rand(N, device="tpu"), torch.float32, 0.0, 1.0, 0.5, 12**-0.5),
    "randn_like": (
        lambda: torch.randn_like(torch.zeros(N, device="tpu", dtype=torch.float64)),
        torch.float64,
        None,
        None,
        0.0,
        1.0,
    ),
    "rand_like": (lambda: torch.rand_like(torch.zeros(N, device="tpu")), torch.float32, 0.0, 1.0, 0.5, 12**-0.5),
    "randint": (lambda: torch.randint(-3, 5, (N,), device="tpu"), torch.int64, -3, 4, 0.5, None),
    "randint_high": (lambda: torch.randint(6, (N,), device="tpu", dtype=torch.int32), torch.int32, 0, 5, 2.5, None),
    "randint_like": (lambda: torch.randint_like(torch.zeros(N, device="tpu"), 2, 9), torch.float32, 2, 8, 5.0, None),
    "uniform_": (lambda: torch.empty(N, device="tpu").uniform_(-2, 3), torch.float32, -2.0, 3.0, 0.5, 5 * 12**-0.5),
    "normal_": (
        lambda: torch.empty(N, device="tpu", dtype=torch.float64).normal_(2, 3),
        torch.float64,
        None,
        None,
        2.0,
        3.0,
    ),
    "normal_tensor": (
        lambda: torch.normal(torch.full((N,), 4.0, device="tpu"), 0.5),
        torch.float32,
        None,
        None,
        4.0,
        0.5,
    ),
    "random_to": (lambda: torch.empty(N, device="tpu").random_(4), torch.float32, 0, 3, 1.5, None),
    "random_from": (
        lambda: torch.empty(N, device="tpu", dtype=torch.int64).random_(-5, 5),
        torch.int64,
        -5,
        4,
        -0.5,
        None,
    ),
    "random_": (lambda: torch.empty(N, device="tpu", dtype=torch.int8).random_(), torch.int8, 0, 127, 63.5, None),
    "random_f32": (lambda: torch.empty(N, device="tpu").random_(), torch.float32, 0, 2**24, 2**23, None),
    "bernoulli_p": (lambda: torch.empty(N, device="tpu").bernoulli_(0.3), torch.float32, 0, 1, 0.3, None),
    "bernoulli": (lambda: torch.bernoulli(torch.full((N,), 0.8, device="tpu")), torch.float32, 0, 1, 0.8, None),
    "exponential_": (lambda: torch.empty(N, device="tpu").exponential_(2.0), torch.float32, 0, None, 0.5, 0.5),
    "randperm": (lambda: torch.randperm(N, device="tpu"), torch.int64, 0, N - 1, (N - 1) / 2, None),
}


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_random_distribution(name, eager_mode):
    make, dtype, low, high, mean, std = RANDOM[name]
    before = _fallbacks()
    with mode(eager_mode):
        out = make()
        host = out.cpu()
    assert _fallbacks() == before, f"cpu fallbacks: {_fallbacks() - before}"
    assert out.device.type == "tpu" and host.shape == (N,) and host.dtype == dtype
    values = host.double()
    if low is not None:
        assert values.min() >= low
    if high is not None:
        assert values.max() <= high
    scale = std if std is not None else (values.std().item() or 1.0)
    assert abs(values.mean().item() - mean) < 0.05 * scale + 1e-9 * abs(mean)
    if std is not None:
        assert abs(values.std().item() - std) < 0.05 * std
    if name in ("randint", "random_from", "randint_high"):  # every value of the range is hit
        assert set(values.long().tolist()) == set(range(int(low), int(high) + 1))
    if name == "randperm":
        assert torch.equal(host.sort().values, torch.arange(N))


DRAWS = {
    "randn": lambda: torch.randn(64, device="tpu"),
    "rand": lambda: torch.rand(3, 5, device="tpu", dtype=torch.float64),
    "randint": lambda: torch.randint(0, 1000, (64,), device="tpu"),
    "randn_like": lambda: torch.randn_like(torch.zeros(8, 8, device="tpu")),
    "normal_": lambda: torch.zeros(64, device="tpu").normal_(2, 3),
    "bernoulli_": lambda: torch.zeros(64, device="tpu").bernoulli_(0.4),
    "multinomial": lambda: torch.multinomial(torch.ones(4, 50, device="tpu"), 10),
}


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_manual_seed_reproduces_and_draws_differ(name, eager_mode):
    draw = DRAWS[name]
    with mode(eager_mode):
        torch.manual_seed(1234)
        first, second = draw().cpu(), draw().cpu()
        torch.manual_seed(1234)
        again = draw().cpu()
        torch.manual_seed(4321)
        other = draw().cpu()
    assert torch.equal(first, again)
    assert not torch.equal(first, second)
    assert not torch.equal(first, other)


def test_seeded_values_do_not_depend_on_mode():
    results = []
    for name in ("defer", "strict"):
        with mode(name):
            torch.manual_seed(7)
            a = torch.randn(5, device="tpu")
            b = torch.rand(5, device="tpu") + a
            results.append((a.cpu(), b.cpu()))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_bernoulli_default_p(eager_mode):
    with mode(eager_mode):
        out = torch.zeros(N, device="tpu").bernoulli_().cpu()
    assert abs(out.mean().item() - 0.5) < 0.02


@pytest.mark.parametrize("replacement", [False, True])
def test_multinomial(replacement, eager_mode):
    probs = torch.tensor([[0.0, 1.0, 3.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    with mode(eager_mode):
        out = torch.multinomial(probs.to("tpu"), 3 if replacement else 2, replacement=replacement).cpu()
    assert out.dtype == torch.int64 and out.shape == (2, 3 if replacement else 2)
    assert set(out[0].tolist()) <= {1, 2}
    if not replacement:
        assert all(len(set(row)) == len(row) for row in out.tolist())


BAD_PARAMETERS = {
    "uniform_from_above_to": lambda x: x.uniform_(2.0, 1.0),
    "bernoulli_p_above_1": lambda x: x.bernoulli_(1.5),
    "bernoulli_functional_p_below_0": lambda x: torch.bernoulli(x, -0.5),
    "random_from_above_to": lambda x: x.random_(5, 2),
    "normal_negative_std": lambda x: x.normal_(0.0, -1.0),
    "exponential_negative_lambda": lambda x: x.exponential_(-1.0),
    "geometric_p_above_1": lambda x: x.geometric_(1.5),
}


@pytest.mark.parametrize("name", list(BAD_PARAMETERS))
def test_bad_random_parameters_raise_torchs_error_at_every_call(name, eager_mode):
    """A random op's parameter values are checked as CPU torch checks them,
    also after a call with good values (a float parameter is a program input,
    not part of the call signature), and the device's random stream is not
    advanced by the failed call."""
    bad = BAD_PARAMETERS[name]
    with pytest.raises(RuntimeError) as cpu:
        bad(torch.ones(4))
    x = torch.ones(4).to("tpu")
    torch.manual_seed(0)
    x.uniform_(0.0, 1.0).bernoulli_(0.5).normal_(0.0, 1.0)  # good values first: the signatures exist
    with pytest.raises(RuntimeError) as tpu:
        bad(x)
    assert str(tpu.value) == str(cpu.value)
    torch.manual_seed(0)
    first = torch.ones(4).to("tpu").uniform_().cpu()
    torch.manual_seed(0)
    with pytest.raises(RuntimeError):
        bad(torch.ones(4).to("tpu"))
    assert torch.equal(torch.ones(4).to("tpu").uniform_().cpu(), first)


def test_random_parameter_check_of_0d_tensors_draws_nothing_on_cpu():
    """The per-call parameter check runs the op on zero-size CPU stand-ins; a 0-d
    parameter's stand-in once had one uninitialised element: it drew from the
    CPU generator and, holding a negative ``std`` by chance, raised torch's error."""
    mean = torch.tensor(0.5, dtype=torch.float64).to("tpu")
    std = torch.tensor(2.0, dtype=torch.float64).to("tpu")
    state = torch.get_rng_state()
    out = torch.normal(mean, std)  # a new call signature: the check runs
    assert torch.equal(torch.get_rng_state(), state)
    assert out.shape == () and torch.isfinite(out.cpu())


@pytest.mark.parametrize(
    "draw, args, out_dtype",
    [
        (torch.rand, (2, 3), torch.float32),
        (torch.rand, (2, 3), torch.float64),
        (torch.randint, (10, (2, 3)), torch.int64),
        (torch.randint, (-3, 10, (2, 3)), torch.int32),
    ],
)
def test_random_factory_out_draws_as_the_factory(draw, args, out_dtype):
    """``torch.rand(..., out=t)`` gives what ``torch.rand(..., device=t.device)``
    gives after the same seed, as on CPU (it ran on CPU, from the CPU generator)."""
    torch.manual_seed(7)
    expected = draw(*args, dtype=out_dtype, device="tpu").cpu()
    out = torch.empty(5, dtype=out_dtype, device="tpu")
    torch.manual_seed(7)
    with no_fallback():
        result = draw(*args, out=out)
    assert result is out and out.shape == (2, 3) and out.dtype is out_dtype
    assert torch.equal(out.cpu(), expected)


@pytest.mark.parametrize("fill", ["arange", "linspace", "logspace", "range"])
def test_range_out_of_the_right_count_keeps_its_shape(fill):
    """``torch.arange(0, 4, out=x.narrow(1, 1, 2))`` fills the 2x2 window in
    its own order, as CPU does (it was resized to 4 contiguous elements at
    the window's offset, writing over other elements of ``x``)."""
    args = {"arange": (0, 4), "linspace": (0, 3, 4), "logspace": (0, 3, 4), "range": (0, 3)}[fill]

    def run(d):
        x, y, z = torch.zeros(2, 3, device=d), torch.zeros(2, 2, device=d), torch.zeros(5, device=d)
        for out in (x.narrow(1, 1, 2), y.t(), z):
            getattr(torch, fill)(*args, out=out)
        return [t.cpu() for t in (x, y, z)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch.range is deprecated
        for got, expected in zip(run("tpu"), run("cpu")):
            assert torch.equal(got, expected)


def test_random_bounds_are_checked_at_every_call():
    """``random_(from, to)`` of values out of the dtype's range raises CPU's
    error (it drew wrapped-around values), at every call: the bounds are
    lifted numbers, not part of the call signature."""
    t = torch.empty(3, dtype=torch.int8, device="tpu")
    t.random_(0, 100)
    t.random_(0, 128)
    with pytest.raises(RuntimeError, match="to - 1 is out of bounds for signed char"):
        t.random_(0, 1000)
    assert 0 <= int(t.min()) and int(t.max()) < 128


@pytest.mark.parametrize("dtype, bound", [(torch.float32, 2**30), (torch.float16, 4000)])
def test_random_bounds_past_exact_integers_warn_at_every_call(dtype, bound):
    """CPU warns at every ``random_(from, to)`` of a float tensor whose bounds
    its dtype cannot hold exactly; so does tpu (it warned at the first call only)."""
    t = torch.empty(4, dtype=dtype, device="tpu")
    for _ in range(3):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t.random_(-bound, bound)
        assert [str(w.message).split(" is out")[0] for w in caught] == ["from", "to - 1"]


_UNINITIALIZED = {
    "empty": lambda d, dt: torch.empty(4, 3, dtype=dt, device=d),
    "empty_out": lambda d, dt: torch.empty(4, 3, out=torch.zeros(1, dtype=dt, device=d)),
    "empty_strided": lambda d, dt: torch.empty_strided((4, 3), (1, 5), dtype=dt, device=d),
    "empty_permuted": lambda d, dt: torch.empty_permuted((2, 3, 5), (1, 0, 2), dtype=dt, device=d),
    "empty_like": lambda d, dt: torch.empty_like(torch.zeros(4, 3, dtype=dt, device=d)),
    "new_empty": lambda d, dt: torch.zeros(1, dtype=dt, device=d).new_empty((4, 3)),
    "new_empty_strided": lambda d, dt: torch.zeros(1, dtype=dt, device=d).new_empty_strided((4, 3), (1, 4)),
    "resize_": lambda d, dt: torch.zeros(3, dtype=dt, device=d).resize_(2, 5)[1],
    "resize_empty": lambda d, dt: torch.zeros(0, dtype=dt, device=d).resize_(6),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64, torch.int32, torch.uint8, torch.bool], ids=str)
@pytest.mark.parametrize("name", sorted(_UNINITIALIZED))
def test_deterministic_mode_fills_uninitialized_memory_as_cpu(name, dtype):
    """Under ``torch.use_deterministic_algorithms(True)`` new memory holds NaN,
    the largest integer or True, as CPU's (Note [Deterministic uninitialized memory])."""
    make = _UNINITIALIZED[name]
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        expected, got = make("cpu", dtype), make("tpu", dtype)
    finally:
        torch.use_deterministic_algorithms(before)
    if name.startswith("resize"):
        expected = expected[-2:]  # the elements past the old storage
        got = got[-2:]
    torch.testing.assert_close(got.cpu(), expected, equal_nan=True, rtol=0, atol=0)


def test_deterministic_mode_copies_data_to_tpu():
    """``torch.tensor(data, device="tpu")`` makes an ``empty`` inside torch's C++
    (its fill must not be a tensor method call, which failed an internal assert)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        made = [torch.tensor([1.5, 2.0], device="tpu"), torch.as_tensor([[3]], device="tpu"), torch.ones(2).to("tpu")]
    finally:
        torch.use_deterministic_algorithms(before)
    assert [t.tolist() for t in made] == [[1.5, 2.0], [[3]], [1.0, 1.0]]
