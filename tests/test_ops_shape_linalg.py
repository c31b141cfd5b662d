"""Shape/view ops and matrix products on ``tpu`` match CPU torch, with gradients.

Each table row is one op family: the input shapes and static arguments it is
tried with (a small set: every distinct shape compiles an XLA program), the
dtypes it supports and whether it is differentiable. Hypothesis draws a row's
variant, dtype and values; the row runs in both eager modes and must not
fall back to CPU, forward or backward.
"""

from __future__ import annotations

import collections

import attrs
import hypothesis
import hypothesis.strategies as st
import pytest
import torch
from conftest import run_both

import lazytpu

F32, F64, I64, B = torch.float32, torch.float64, torch.int64, torch.bool
ALL = (F32, F64, I64, B)
NUMERIC = (F32, F64, I64)
FLOAT = (F32, F64)

fixture_settings = hypothesis.settings(suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])


@attrs.frozen
class Case:
    """``fn(*tensors, *params)`` for each ``(shapes, params)`` variant."""

    name: str
    fn: object
    variants: tuple
    dtypes: tuple = ALL
    grad: bool = True

    def __str__(self) -> str:
        return self.name


def _v(*shapes, params=()):
    return (shapes, params)


def _slice(x, dim, start, end, step):
    return x[(slice(None),) * dim + (slice(start, end, step),)]


# Views: windows on their base's storage (the dispatcher's aliasing), read back
# through ``view_read``; their gradients use the backward rules.
VIEW_DTYPES = (F32, I64, B)
VIEW_CASES = [
    Case(
        "view",
        lambda x, s: x.view(s),
        (
            _v((2, 3, 4), params=((6, 4),)),
            _v((2, 3, 4), params=((-1,),)),
            _v((0, 3), params=((3, 0),)),
            _v((), params=((1, 1),)),
            _v((5,), params=((1, -1, 1),)),
        ),
        VIEW_DTYPES,
    ),
    Case(
        "reshape_noncontiguous",
        lambda x, s: x.transpose(0, -1).reshape(s),
        (_v((2, 3, 4), params=((4, -1),)), _v((3, 2), params=((6,),))),
        VIEW_DTYPES,
    ),
    Case(
        "flatten",
        lambda x, a, b: x.flatten(a, b),
        (_v((2, 3, 4), params=(1, 2)), _v((), params=(0, -1)), _v((2, 0, 3), params=(0, 1))),
        VIEW_DTYPES,
    ),
    Case("unflatten", lambda x, d, s: x.unflatten(d, s), (_v((6, 4), params=(-1, (-1, 2))),), VIEW_DTYPES),
    Case(
        "permute",
        lambda x, p: x.permute(p),
        (_v((2, 3, 4), params=((2, 0, 1),)), _v((2, 3, 4), params=((-1, 0, 1),)), _v((), params=((),))),
        VIEW_DTYPES,
    ),
    Case(
        "transpose",
        lambda x, a, b: x.transpose(a, b),
        (_v((2, 3, 4), params=(-1, -3)), _v((), params=(0, -1)), _v((3,), params=(0, 0))),
        VIEW_DTYPES,
    ),
    Case("t", lambda x: x.t(), (_v((3, 4)), _v((5,)), _v(())), VIEW_DTYPES),
    Case("movedim", lambda x, a, b: x.movedim(a, b), (_v((2, 3, 4), params=(0, -1)),), VIEW_DTYPES),
    Case(
        "expand",
        lambda x, s: x.expand(s),
        (
            _v((3, 1), params=((2, 3, 4),)),
            _v((3, 1), params=((-1, 5),)),
            _v((), params=((2, 2),)),
            _v((1,), params=((0,),)),
        ),
        VIEW_DTYPES,
    ),
    Case("squeeze", lambda x: x.squeeze(), (_v((3, 1)), _v((1, 1, 1)), _v(()), _v((0, 1))), VIEW_DTYPES),
    Case(
        "squeeze_dims",
        lambda x, d: x.squeeze(d),
        (
            _v((3, 1), params=(1,)),
            _v((1, 3), params=(-2,)),
            _v((), params=(0,)),
            _v((1, 3, 1), params=((0, 2),)),
            _v((1, 3, 1), params=((-1, 1),)),
        ),
        VIEW_DTYPES,
    ),
    Case(
        "unsqueeze",
        lambda x, d: x.unsqueeze(d),
        (_v((3, 4), params=(0,)), _v((3, 4), params=(-1,)), _v((), params=(0,)), _v((0, 2), params=(1,))),
        VIEW_DTYPES,
    ),
    Case(
        "slice",
        _slice,
        (
            _v((5, 6), params=(0, 1, 4, 1)),
            _v((5, 6), params=(1, None, None, 2)),
            _v((5, 6), params=(0, -3, None, 2)),
            _v((5, 6), params=(1, -100, 100, 3)),
            _v((5, 6), params=(0, 4, 2, 1)),
            _v((0, 6), params=(0, 0, 5, 1)),
            _v((5, 6), params=(1, 7, None, 1)),
        ),
        VIEW_DTYPES,
    ),
    Case(
        "select",
        lambda x, d, i: x.select(d, i),
        (_v((5, 6), params=(0, 2)), _v((5, 6), params=(1, -1)), _v((5,), params=(0, -5))),
        VIEW_DTYPES,
    ),
    Case("narrow", lambda x, d, s, n: x.narrow(d, s, n), (_v((5, 6), params=(0, -2, 2)),), VIEW_DTYPES),
    Case("getitem", lambda x: x[None, ..., 1:, -1], (_v((2, 3, 4)),), VIEW_DTYPES),
    Case(
        "split",
        lambda x, s, d: x.split(s, d),
        (
            _v((5, 3), params=(2, 0)),
            _v((5, 3), params=(1, -1)),
            _v((0, 3), params=(2, 0)),
            _v((5, 3), params=([0, 5], 0)),
            _v((5, 3), params=([1, 2], -1)),
        ),
        VIEW_DTYPES,
    ),
    Case("chunk", lambda x, n, d: x.chunk(n, d), (_v((5, 3), params=(2, 0)),), VIEW_DTYPES),
    Case("unbind", lambda x, d: x.unbind(d), (_v((5, 3), params=(-1,)), _v((0, 3), params=(1,))), VIEW_DTYPES),
    Case(
        "diagonal",
        lambda x, o, a, b: x.diagonal(o, a, b),
        (_v((3, 4), params=(1, 0, 1)), _v((2, 3, 4), params=(-1, -1, 0))),
        VIEW_DTYPES,
    ),
]

# The functional ``*_copy`` forms of the views: these run the shape rules.
COPY_DTYPES = (F32, F64, I64, B)
COPY_CASES = [
    Case(
        "view_copy",
        lambda x, s: torch.view_copy(x, s),
        (_v((2, 3, 4), params=((6, -1),)), _v((), params=((1,),))),
        COPY_DTYPES,
    ),
    Case(
        "permute_copy",
        lambda x, p: torch.permute_copy(x, p),
        (_v((2, 3, 4), params=((-1, 0, 1),)), _v((), params=((),))),
        COPY_DTYPES,
    ),
    Case(
        "transpose_copy",
        lambda x, a, b: torch.transpose_copy(x, a, b),
        (_v((2, 3, 4), params=(0, -1)), _v((), params=(0, -1))),
        COPY_DTYPES,
    ),
    Case("t_copy", torch.t_copy, (_v((3, 4)), _v((5,))), COPY_DTYPES),
    Case(
        "expand_copy",
        lambda x, s: torch.expand_copy(x, s),
        (_v((3, 1), params=((2, -1, 4),)), _v((), params=((2,),))),
        COPY_DTYPES,
    ),
    Case(
        "squeeze_copy",
        lambda x, *d: torch.squeeze_copy(x, *d),
        (_v((3, 1)), _v((1, 3, 1), params=((0, -1),)), _v((), params=(0,)), _v((3, 1), params=(0,))),
        COPY_DTYPES,
    ),
    Case(
        "unsqueeze_copy",
        lambda x, d: torch.unsqueeze_copy(x, d),
        (_v((3, 4), params=(-1,)), _v((), params=(0,))),
        COPY_DTYPES,
    ),
    Case(
        "slice_copy",
        lambda x, *a: torch.slice_copy(x, *a),
        (_v((5, 6), params=(1, -100, 100, 3)), _v((5, 6), params=(0, -3, None, 2)), _v((5, 6), params=(0, 4, 2, 1))),
        COPY_DTYPES,
    ),
    Case("select_copy", lambda x, d, i: torch.select_copy(x, d, i), (_v((5, 6), params=(-1, -2)),), COPY_DTYPES),
    Case(
        "split_copy",
        lambda x, s, d: torch.split_copy(x, s, d),
        (_v((5, 3), params=(2, 0)), _v((0, 3), params=(2, 0)), _v((0, 3), params=(0, 0))),
        COPY_DTYPES,
    ),
    Case(
        "split_with_sizes_copy",
        lambda x, s, d: torch.split_with_sizes_copy(x, s, d),
        (_v((5, 3), params=([0, 5], 0)), _v((5, 3), params=([1, 2], -1))),
        COPY_DTYPES,
    ),
    Case("unbind_copy", lambda x, d: torch.unbind_copy(x, d), (_v((5, 3), params=(-1,)),), COPY_DTYPES),
    Case(
        "diagonal_copy",
        lambda x, o, a, b: torch.diagonal_copy(x, o, a, b),
        (_v((3, 4), params=(-1, 0, 1)), _v((2, 3, 4), params=(1, -1, 0))),
        COPY_DTYPES,
    ),
    Case("alias_copy", torch.alias_copy, (_v((2, 3)),), COPY_DTYPES),
]

# Ops that make new values.
VALUE_CASES = [
    Case(
        "cat",
        lambda x, y, d: torch.cat([x, y], d),
        (
            _v((2, 3), (4, 3), params=(0,)),
            _v((2, 3), (2, 1), params=(-1,)),
            _v((2, 3), (0,), params=(1,)),
            _v((2, 0), (2, 3), params=(1,)),
        ),
    ),
    Case(
        "stack",
        lambda x, y, d: torch.stack([x, y], d),
        (
            _v((2, 3), (2, 3), params=(0,)),
            _v((2, 3), (2, 3), params=(-1,)),
            _v((), (), params=(0,)),
            _v((0, 2), (0, 2), params=(1,)),
        ),
    ),
    Case(
        "index_select",
        lambda x, d, i: x.index_select(d, i),
        (_v((5, 3), params=(0, [0, 2, 2])), _v((5, 3), params=(-1, [2])), _v((5, 3), params=(1, []))),
    ),
    Case("clone", lambda x: x.clone(), (_v((5, 3)), _v(()))),
    Case("contiguous", lambda x: x.t().contiguous(), (_v((5, 3)),)),
    Case("flip", lambda x, d: x.flip(d), (_v((2, 3, 4), params=((0, -1),)), _v((), params=((),)))),
    Case(
        "roll",
        lambda x, s, d: x.roll(s, d),
        (_v((2, 3, 4), params=(1, 0)), _v((2, 3, 4), params=((-2, 5), (1, 2))), _v((2, 3), params=(4, ()))),
    ),
    Case("repeat", lambda x, r: x.repeat(r), (_v((2, 3), params=((2, 1),)), _v((3,), params=((2, 1, 2),)))),
    Case(
        "constant_pad",
        lambda x, p, v: torch.nn.functional.pad(x, p, value=v),
        (
            _v((2, 3), params=((1, 2), 0)),
            _v((2, 3, 4), params=((0, 1, -1, 2), 1.5)),
            _v((2, 3), params=((-1, 0, 1, 1), 2)),
        ),
    ),
    Case(
        "view_dtype",
        lambda x, d: x.view(d),
        (
            _v((2, 4), params=(torch.int32,)),
            _v((2, 4), params=(torch.int16,)),
            _v((2, 4), params=(torch.uint8,)),
            _v((2, 4), params=(torch.float64,)),
        ),
        dtypes=(F32, F64, I64),
        grad=False,
    ),
]

SHAPE_CASES = VIEW_CASES + COPY_CASES + VALUE_CASES

LINALG_CASES = [
    Case("mm", torch.mm, (_v((2, 3), (3, 4)), _v((0, 3), (3, 4)), _v((2, 0), (0, 4))), dtypes=NUMERIC),
    Case("bmm", torch.bmm, (_v((5, 2, 3), (5, 3, 4)), _v((0, 2, 3), (0, 3, 4))), dtypes=NUMERIC),
    Case(
        "matmul",
        torch.matmul,
        (
            _v((5, 1, 2, 3), (4, 3, 4)),
            _v((2, 3), (3,)),
            _v((3,), (3,)),
            _v((5, 2, 3), (3, 4)),
            _v((2, 3), (5, 3, 4)),
            _v((3,), (3, 4)),
        ),
        dtypes=NUMERIC,
    ),
    Case("dot", torch.dot, (_v((3,), (3,)), _v((0,), (0,))), dtypes=NUMERIC),
    Case("vdot", torch.vdot, (_v((3,), (3,)),), dtypes=FLOAT),
    Case("mv", torch.mv, (_v((2, 3), (3,)),), dtypes=NUMERIC),
    Case("outer", torch.outer, (_v((2,), (3,)),), dtypes=NUMERIC),
    Case(
        "addmm",
        lambda b, x, y, beta, alpha: torch.addmm(b, x, y, beta=beta, alpha=alpha),
        (
            _v((4,), (2, 3), (3, 4), params=(1, 1)),
            _v((2, 4), (2, 3), (3, 4), params=(0.5, 2.0)),
            _v((1, 4), (2, 3), (3, 4), params=(0, -0.5)),
        ),
        dtypes=FLOAT,
    ),
    Case(
        "addmm_int",
        lambda b, x, y, beta, alpha: torch.addmm(b, x, y, beta=beta, alpha=alpha),
        (_v((4,), (2, 3), (3, 4), params=(2, 3)),),
        dtypes=(I64,),
    ),
    Case(
        "baddbmm",
        lambda b, x, y, beta, alpha: torch.baddbmm(b, x, y, beta=beta, alpha=alpha),
        (_v((5, 2, 4), (5, 2, 3), (5, 3, 4), params=(0.5, 2.0)), _v((4,), (5, 2, 3), (5, 3, 4), params=(1, 1))),
        dtypes=FLOAT,
    ),
    Case(
        "addbmm",
        lambda b, x, y, beta, alpha: torch.addbmm(b, x, y, beta=beta, alpha=alpha),
        (_v((2, 4), (5, 2, 3), (5, 3, 4), params=(0.5, 2.0)),),
        dtypes=FLOAT,
    ),
    Case(
        "addmv",
        lambda b, x, y, beta, alpha: torch.addmv(b, x, y, beta=beta, alpha=alpha),
        (_v((2,), (2, 3), (3,), params=(0.5, 2.0)),),
        dtypes=FLOAT,
    ),
    Case(
        "addr",
        lambda b, x, y, beta, alpha: torch.addr(b, x, y, beta=beta, alpha=alpha),
        (_v((2, 3), (2,), (3,), params=(0.5, 2.0)),),
        dtypes=FLOAT,
    ),
    Case("tril", lambda x, k: x.tril(k), (_v((3, 4), params=(0,)), _v((2, 3, 3), params=(-1,))), dtypes=ALL),
    Case("triu", lambda x, k: x.triu(k), (_v((4, 3), params=(1,)), _v((0, 3), params=(0,))), dtypes=ALL),
    Case("linear", torch.nn.functional.linear, (_v((5, 3), (4, 3), (4,)), _v((2, 5, 3), (4, 3))), dtypes=FLOAT),
    Case("einsum", lambda x, y: torch.einsum("bij,bkj->bik", x, y), (_v((2, 3, 4), (2, 5, 4)),), dtypes=FLOAT),
]


def _make(shape, dtype, gen, grad: bool) -> torch.Tensor:
    if dtype == B:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype == I64:
        return torch.randint(-9, 10, shape, generator=gen)
    return torch.randn(shape, generator=gen, dtype=dtype).requires_grad_(grad)


def _fallbacks() -> collections.Counter:
    return collections.Counter(lazytpu.metrics.snapshot()["cpu_fallbacks"])


def check_no_fallback(fn, *inputs, mode: str, grad: bool) -> None:
    """``run_both`` that also asserts nothing ran on CPU."""
    before = _fallbacks()
    run_both(fn, *inputs, mode_name=mode, grad=grad)
    assert _fallbacks() == before, f"cpu fallbacks: {_fallbacks() - before}"


def _run_case(case: Case, data, mode: str) -> None:
    shapes, params = data.draw(st.sampled_from(case.variants), label="variant")
    dtype = data.draw(st.sampled_from(case.dtypes), label="dtype")
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    grad = case.grad and dtype.is_floating_point
    tensors = [_make(s, dtype, gen, grad) for s in shapes]
    if case.name == "index_select":  # the index is a tensor argument
        dim, index = params
        params = (dim, torch.tensor(index, dtype=torch.int64))
    check_no_fallback(case.fn, *tensors, *params, mode=mode, grad=grad)


@pytest.mark.parametrize("case", SHAPE_CASES, ids=str)
@fixture_settings
@hypothesis.given(data=st.data())
def test_shape_op_matches_cpu(case, data, eager_mode):
    _run_case(case, data, eager_mode)


@pytest.mark.parametrize("case", LINALG_CASES, ids=str)
@fixture_settings
@hypothesis.given(data=st.data())
def test_linalg_op_matches_cpu(case, data, eager_mode):
    _run_case(case, data, eager_mode)


# -- targeted checks -------------------------------------------------------------


def test_addmm_beta_zero_ignores_nan_in_self(eager_mode):
    bias = torch.full((2, 4), float("nan"))
    x, y = torch.randn(2, 3), torch.randn(3, 4)
    for beta in (0, 0.0):
        check_no_fallback(
            lambda b, x, y, beta: torch.addmm(b, x, y, beta=beta), bias, x, y, beta, mode=eager_mode, grad=False
        )


def test_cat_promotes_mixed_dtypes(eager_mode):
    f, i, b = torch.randn(2, 3), torch.arange(6).reshape(2, 3), torch.ones(2, 3, dtype=torch.bool)
    check_no_fallback(
        lambda f, i, b: (torch.cat([f, i]), torch.cat([i, b]), torch.stack([b, i])),
        f,
        i,
        b,
        mode=eager_mode,
        grad=False,
    )


def test_index_select_gradient_accumulates_duplicates(eager_mode):
    x = torch.randn(4, 3, requires_grad=True)
    index = torch.tensor([1, 1, 3, 1])
    check_no_fallback(lambda x, i: x.index_select(0, i) * 2, x, index, mode=eager_mode, grad=True)


def test_view_chain_under_autograd(eager_mode):
    x = torch.randn(2, 3, 4, requires_grad=True)

    def fn(x):
        y = x.permute(2, 0, 1).reshape(4, 6)[1:, ::2].t().unsqueeze(0).expand(2, 3, 3)
        return torch.cat([y, y.flip(-1)], 1).split(2, 1)

    check_no_fallback(fn, x, mode=eager_mode, grad=True)
