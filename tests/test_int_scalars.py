"""Python numbers meeting narrower tensors behave as on CPU torch
(Note [Python integers wrap] in lazytpu/_dtypes.py).

torch converts a Python int operand to the dtype the op computes in modulo
2**bits (``uint8 + 300`` adds 44), except where its kernel checks the
conversion (``fill_``, ``full``, ``masked_fill``, ``clamp``, ``alpha``, ...),
which raises ``value cannot be converted to type uint8_t without overflow``;
``bool - 1``, ``int // 0``, ``int ** -1`` and a bool ``alpha`` of a non-bool
result raise too. On ``tpu`` each case gives CPU
torch's values and dtype, or its error type and message raised at the call,
never a failed deferred program. The same holds for Python floats into the
ops that check their conversion (``half.fill_(1e6)``, ``uint8.fill_(-2.7)``):
a float is a program input, so its value is checked at every call.
"""

from __future__ import annotations

import gc
import itertools
import weakref

import numpy as np
import pytest
import torch
from conftest import tolerance

import lazytpu

OPS = {
    "add": lambda x, v: x + v,
    "radd": lambda x, v: v + x,
    "sub": lambda x, v: x - v,
    "rsub": lambda x, v: v - x,
    "mul": lambda x, v: x * v,
    "floordiv": lambda x, v: x // v,
    "remainder": lambda x, v: x % v,
    "truediv": lambda x, v: x / v,
    "eq": lambda x, v: x == v,
    "lt": lambda x, v: x < v,
    "ge": lambda x, v: x >= v,
    "bitwise_and": lambda x, v: x & v,
    "bitwise_xor": lambda x, v: x ^ v,
    "iadd": lambda x, v: x.clone().add_(v),
    "add_alpha": lambda x, v: torch.add(x, x, alpha=v),
    "fill_": lambda x, v: x.clone().fill_(v),
    "full": lambda x, v: torch.full((3,), v, dtype=x.dtype, device=x.device),
    "full_like": lambda x, v: torch.full_like(x, v),
    "clamp_min": lambda x, v: x.clamp(min=v),
    "clamp_max": lambda x, v: x.clamp(max=v),
    "where": lambda x, v: torch.where(x > 1, x, v),
    "masked_fill": lambda x, v: x.masked_fill(x > 1, v),
    "index_fill": lambda x, v: x.clone().index_fill_(0, torch.tensor([0], device=x.device), v),
    "setitem": lambda x, v: _setitem(x.clone(), v),
    "pow": lambda x, v: x**v,  # a negative int exponent of an integer tensor raises
    "pow_": lambda x, v: x.clone().pow_(v),
}
DTYPES = (torch.uint8, torch.int8, torch.int32, torch.int64, torch.bool)
VALUES = (300, -1, -300, 2**33, 2**63)


FLOAT_OPS = {
    "fill_": lambda x, v: x.clone().fill_(v),
    "full_like": lambda x, v: torch.full_like(x, v),
    "masked_fill": lambda x, v: x.masked_fill(x > 1, v),
    "index_fill": lambda x, v: x.clone().index_fill_(0, torch.tensor([0], device=x.device), v),
    "scatter": lambda x, v: x.scatter(0, torch.tensor([0], device=x.device), v),
    "clamp_min": lambda x, v: x.clamp(min=v),
    "clamp_max": lambda x, v: x.clamp(max=v),
    "add_alpha": lambda x, v: torch.add(x, x, alpha=v),
    "threshold_value": lambda x, v: torch.nn.functional.threshold(x, 1, v),
    "pad": lambda x, v: torch.nn.functional.pad(x, (1, 1), value=v),
    "add": lambda x, v: x + v,
}
FLOAT_DTYPES = (torch.bool, torch.uint8, torch.int32, torch.float16, torch.bfloat16, torch.float32)
FLOAT_VALUES = (7.0, -2.7, 7e4, 1e10, 1e39, float("inf"), float("nan"))


def _setitem(x, v):
    x[0] = v
    return x


def _outcome(fn, *args, **kwargs):
    """The tensor ``fn(*args)`` returns, or its error as (type, message); a
    kernel's name is the backend's (``"threshold_cpu" not implemented`` is
    ``threshold_tpu`` on tpu)."""
    try:
        out = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - compared with CPU torch's
        return type(exc), str(exc).replace("_cpu", "_tpu")
    return out


def _input(dtype, device="cpu"):
    if dtype is torch.bool:
        return torch.tensor([True, False, True], device=device)
    return torch.tensor([1, 2, 100], dtype=dtype, device=device)


@pytest.mark.parametrize(("op", "dtype", "value"), list(itertools.product(OPS, DTYPES, VALUES)))
def test_python_int_operand_as_cpu_torch(op, dtype, value):
    fn = OPS[op]
    expected = _outcome(lambda: fn(_input(dtype), value))
    x = _input(dtype, "tpu")
    got = _outcome(lambda: fn(x, value))  # an error must come from the call itself
    if isinstance(expected, tuple):
        assert got == expected
        return
    assert isinstance(got, torch.Tensor), got
    got = got.cpu()  # a failed deferred program would raise here
    assert got.dtype == expected.dtype
    assert torch.equal(got, expected) if not expected.is_floating_point() else torch.allclose(got, expected)


@pytest.mark.parametrize("size", (1, 3, 100))
@pytest.mark.parametrize(("op", "dtype"), list(itertools.product(FLOAT_OPS, FLOAT_DTYPES)))
def test_python_float_operand_as_cpu_torch(op, dtype, size):
    """Every value of one op and dtype is one call signature: after the first
    call, each value is checked by the per-call range check."""
    fn = FLOAT_OPS[op]
    base = torch.arange(size).remainder(4).to(dtype)
    for value in FLOAT_VALUES:
        expected = _outcome(fn, base, value)
        got = _outcome(fn, base.to("tpu"), value)
        if isinstance(expected, tuple):
            assert got == expected, value
            continue
        assert isinstance(got, torch.Tensor), (value, got)
        got = got.cpu()
        assert got.dtype == expected.dtype, value
        # half/bfloat16 arithmetic: torch's CPU kernels round differently by size (vectorized or not)
        # and XLA keeps excess precision; the values differ in the last few places
        tol = dict(rtol=4 * torch.finfo(dtype).eps, atol=0) if dtype in (torch.float16, torch.bfloat16) else {}
        torch.testing.assert_close(got, expected, equal_nan=True, **(tol or tolerance(dtype)))


@pytest.mark.parametrize("alpha", (True, False))
@pytest.mark.parametrize("dtype", (torch.bool, torch.int8, torch.float32))
@pytest.mark.parametrize("op", (torch.add, torch.sub))
def test_bool_alpha_as_cpu_torch(op, dtype, alpha):
    """``alpha=True`` is for bool results only (tpu computed ``1 + 2 * True``)."""
    x = torch.tensor([1, 0, 1], dtype=dtype)
    expected = _outcome(op, x, x, alpha=alpha)
    got = _outcome(op, x.to("tpu"), x.to("tpu"), alpha=alpha)
    if isinstance(expected, tuple):
        assert got == expected
    else:
        assert torch.equal(got.cpu(), expected)


def test_overflow_error_at_the_call_loses_no_pending_data():
    x = torch.tensor([1, 2, 3], dtype=torch.uint8).to("tpu")
    doubled = x * 2  # pending
    with pytest.raises(RuntimeError, match="value cannot be converted to type uint8_t without overflow"):
        x.fill_(300)
    assert doubled.cpu().tolist() == [2, 4, 6]
    assert x.cpu().tolist() == [1, 2, 3]  # unchanged, as on CPU


def test_integer_division_by_a_zero_python_int():
    x = torch.tensor([3, 4]).to("tpu")
    divisions = (
        lambda t: t // 0,
        lambda t: t % 0,
        lambda t: torch.fmod(t, 0),
        lambda t: torch.div(t, 0, rounding_mode="floor"),
    )
    for fn in divisions:
        with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
            fn(x)
    # 256 is 0 in uint8; an empty tensor has no element to divide
    with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
        torch.tensor([3], dtype=torch.uint8).to("tpu") // 256
    assert (torch.empty(0, dtype=torch.int64).to("tpu") // 0).cpu().shape == (0,)
    assert (torch.tensor([3.0]).to("tpu") // 0).cpu().item() == float("inf")


def test_changing_python_ints_reuse_one_program():
    """An int operand is a program input, like a float (Note [Scalar lifting])."""
    x = torch.arange(6).to("tpu")
    f = torch.linspace(-1, 1, 6).to("tpu")

    def step(i):
        a = (x * i + i) % (i + 1) - x.masked_fill(x > 2, i)
        return (a.sum() + f.clamp(max=i).sum() + torch.full_like(x, i).sum()).item()

    for i in (1, 2):  # the first step also computes the transfers' programs
        assert step(i) == pytest.approx(_cpu_step(i))
    before = lazytpu.metrics.snapshot()["programs_compiled"]
    for i in (3, 17, -5, 2**40):
        assert step(i) == pytest.approx(_cpu_step(i))
    assert lazytpu.metrics.snapshot()["programs_compiled"] == before


def test_lifted_scalars_reach_the_program_packed_by_kind(monkeypatch):
    """Note [Packed scalars] in lazytpu/lowering/to_jax.py: a program's lifted numbers
    arrive as one array per kind after its buffers (not an argument each), with the
    values and dtypes CPU torch computes, and donation still finds its buffers. The
    first program has them as constants (Note [Scalar specialization] in
    lazytpu.fusion.specialize): no packed arguments; once they change, they are."""
    from lazytpu.runtime import executor

    calls = []
    run_compiled = executor.run_compiled
    monkeypatch.setattr(
        executor,
        "run_compiled",
        lambda c, args, blocking=False, **counted: calls.append(args) or run_compiled(c, args, blocking, **counted),
    )
    x, i, c = torch.linspace(-1, 1, 4), torch.arange(4), torch.ones(3, dtype=torch.complex64)
    tx, ti, tc = x.to("tpu"), i.to("tpu"), c.to("tpu")
    lazytpu.sync()
    for k in (1, 2, 3):
        calls.clear()
        h = 0.25 * k
        out = [tx * (0.5 * k) + h, ti * (3 * k) - 7 * k, tc * complex(1, k), (tx + 2.0 * k).to(torch.float16) * h]
        tx.add_(0.5 * k)  # an in-place write of a materialized buffer: its old value is donated
        lazytpu.sync()
        expected = [x * (0.5 * k) + h, i * (3 * k) - 7 * k, c * complex(1, k), (x + 2.0 * k).to(torch.float16) * h]
        x.add_(0.5 * k)
        for got, want in zip(out, expected):
            torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
        torch.testing.assert_close(tx.cpu(), x, rtol=0, atol=0)
        (args,) = calls
        packed = [a for a in args if isinstance(a, np.ndarray)]
        if k == 1:
            assert packed == [] and len(args) == 3  # three buffers; every number compiled in
            continue
        assert [a.dtype for a in packed] == [np.float64, np.int64, np.complex128]
        assert len(args) == 3 + len(packed)  # three buffers, then the packed numbers
        assert packed[0].tolist() == [0.5 * k, h, 2.0 * k, h, 0.5 * k] and packed[1].tolist() == [3 * k, 7 * k]


def _cpu_step(i):
    x, f = torch.arange(6), torch.linspace(-1, 1, 6)
    a = (x * i + i) % (i + 1) - x.masked_fill(x > 2, i)
    return (a.sum() + f.clamp(max=i).sum() + torch.full_like(x, i).sum()).item()


def test_a_signatures_first_call_keeps_no_tensor_alive():
    """The once-per-signature CPU checks (of kernels, of numbers) keep no
    recorded tensor alive: an exception kept with its traceback would hold
    the recording frames until a garbage collection, and the tensors would
    be outputs of the next program."""
    u = torch.arange(15).reshape(3, 5).to("tpu")  # a shape no other test records
    gc.disable()
    try:
        m = (u * 7).max()  # max's kernel check raises on its zero-size stand-ins (not re-raised)
        ref = weakref.ref(m)
        flag = m == 0
        del m
        assert ref() is None
        assert not bool(flag)
    finally:
        gc.enable()


SHIFTS = {
    "lshift": lambda x, y: x << y,
    "rshift": lambda x, y: x >> y,
    "ilshift": lambda x, y: x.clone().__ilshift__(y),
    "bitwise_left_shift": torch.bitwise_left_shift,
    "bitwise_right_shift_": lambda x, y: x.clone().bitwise_right_shift_(y),
}
SHIFT_OPERANDS = {
    "bool": lambda d: torch.tensor([True, False], device=d),
    "bool_0d": lambda d: torch.tensor(True, device=d),
    "uint8": lambda d: torch.tensor([3, 200], dtype=torch.uint8, device=d),
    "int64": lambda d: torch.tensor([1, 2], device=d),
    "float": lambda d: torch.tensor([1.0, 2.0], device=d),
}
SHIFT_NUMBERS = {"0": 0, "1": 1, "True": True, "1.5": 1.5}


def _shift_pairs():
    """(op, left, right): bool tensors against tensors and Python numbers on either side."""
    for op in SHIFTS:
        for other in (*SHIFT_OPERANDS, *SHIFT_NUMBERS):
            yield op, "bool", other
            if op in ("lshift", "rshift", "bitwise_left_shift"):
                yield op, other, "bool"


@pytest.mark.parametrize(("op", "left", "right"), list(_shift_pairs()))
def test_shift_with_bool_as_cpu_torch(op, left, right):
    """``<<``/``>>`` promote a bool operand as CPU does (``bool << 0`` is int64)
    on the device, and raise CPU's error where CPU does (a bool result)."""

    def operand(name, device):
        return SHIFT_OPERANDS[name](device) if name in SHIFT_OPERANDS else SHIFT_NUMBERS[name]

    fn = SHIFTS[op]
    expected = _outcome(lambda: fn(operand(left, "cpu"), operand(right, "cpu")))
    before = dict(lazytpu.metrics.snapshot()["cpu_fallbacks"])
    got = _outcome(lambda: fn(operand(left, "tpu"), operand(right, "tpu")))
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == before
    if isinstance(expected, tuple):
        assert got == expected
        return
    assert isinstance(got, torch.Tensor), got
    assert got.dtype == expected.dtype and torch.equal(got.cpu(), expected)
