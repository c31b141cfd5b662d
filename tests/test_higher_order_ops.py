"""Higher-order operators (``torch.cond``, ``while_loop``, ``scan``, ``map``,
...) on ``tpu`` tensors run as on CPU: their dense kernels call the functions,
whose ops are recorded (Note [Higher-order operators])."""

from __future__ import annotations

import contextlib
import functools
import warnings

import pytest
import torch
from conftest import assert_close, no_fallback, programs_run, run_both, to_cpu, to_tpu
from torch._higher_order_ops import while_loop
from torch.testing._internal.hop_db import hop_db

import lazytpu


def _cond(x):
    return torch.cond(x.sum() > 0, lambda x: x.sin() * 2, lambda x: x.cos() - 1, (x,))


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_cond_takes_the_branch_cpu_takes_with_gradients(sign):
    x = (torch.rand(4, 3, dtype=torch.float64) + 0.1) * sign
    with no_fallback():
        run_both(_cond, x.requires_grad_(), grad=True)


def test_cond_branch_fuses_with_the_ops_around_it():
    x = torch.randn(8).to("tpu")

    def step():
        (_cond(x * 3) + 1).sum().item()

    step()
    # the predicate's read is one program, the branch and the rest another
    assert programs_run(step) == 2


def _compiled_cond(x, w):
    def on_true(x, w):
        return torch.cond(w.sum() > 0, lambda x, w: (x * w).sin(), lambda x, w: x - w, (x, w)) * 2

    return (torch.cond(x.sum() > 0, lambda x, w: on_true(x, w), lambda x, w: (x + w).cos(), (x, w)) + 1).sum()


def test_cond_in_a_compiled_function_is_one_program_with_both_branches():
    """``lax.cond`` of the branches (Note [Control flow]) (a nested ``cond``
    too), forward and backward, no read of the predicate, no recompile when
    the other branch is taken."""
    compiled = torch.compile(_compiled_cond, backend="tpu")
    compiles = []
    for sign, w_sign in ((1.0, 1.0), (1.0, 1.0), (-1.0, 1.0), (1.0, -1.0), (-1.0, -1.0)):  # two to warm up
        x = torch.rand(4, dtype=torch.float64) * sign
        w = (torch.rand(4, dtype=torch.float64) * w_sign).requires_grad_()
        expected = _compiled_cond(x, w)
        expected.backward()
        w_tpu = to_tpu(w)
        before = lazytpu.metrics.snapshot()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing runs op by op
            actual = compiled(to_tpu(x), w_tpu)
            actual.backward()
        assert_close(actual.detach().cpu(), expected)
        assert_close(w_tpu.grad.cpu(), w.grad)
        after = lazytpu.metrics.snapshot()
        compiles.append(after["programs_compiled"] - before["programs_compiled"])
        assert after["syncs"].get("item", 0) == before["syncs"].get("item", 0)  # the predicates stay on the device
    assert compiles[2:] == [0, 0, 0]


def test_while_loop_in_a_compiled_function_loops_on_the_device():
    def fn(x, k):
        start = torch.zeros((), dtype=torch.int64, device=x.device)
        return while_loop(lambda i, a: (i < 6) & (a.sum() < 100), lambda i, a: (i + 1, a * k + 1), (start, x))

    compiled = torch.compile(fn, backend="tpu")
    for scale in (1.0, 1.0, 20.0, 0.01):  # stops at the sum, then at the count
        x, k = torch.rand(4, dtype=torch.float64) * scale, torch.tensor(2.0, dtype=torch.float64)
        before = lazytpu.metrics.snapshot()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing runs op by op
            actual = compiled(to_tpu(x), to_tpu(k))
        after = lazytpu.metrics.snapshot()
        assert after["syncs"].get("item", 0) == before["syncs"].get("item", 0)
        assert_close(to_cpu(actual), fn(x, k))


def test_cond_with_a_random_branch_in_a_compiled_function_runs_op_by_op():
    """A branch a random op draws in stays eager (the graph runs op by op,
    Note [Graphs that cannot lower]) and takes CPU's branch."""

    def fn(x):
        return torch.cond(x.sum() > 0, lambda x: x + torch.rand_like(x) * 0, lambda x: x * 2, (x,))

    compiled = torch.compile(fn, backend="tpu")
    with pytest.warns(UserWarning, match="random op .* in a cond function"):
        for sign in (1.0, -1.0):
            x = torch.rand(4) * sign
            assert_close(compiled(x.to("tpu")).cpu(), fn(x))


def test_while_loop_reads_its_condition_each_iteration():
    def fn(x):
        return while_loop(lambda i, a: (i < 4) & (a.sum() < 100), lambda i, a: (i + 1, a * 2 + 1), (x.new_zeros(()), x))

    with no_fallback():
        run_both(fn, torch.tensor([1.0, 2.0, 3.0]))


def test_scan_and_map():
    def fn(init, xs):
        carry, ys = torch._higher_order_ops.scan(lambda c, x: (c + x, (c * x).tanh()), init, xs)
        mapped = torch._higher_order_ops.map(lambda x, y: x * y + 1, xs, init)
        return carry, ys, mapped

    with no_fallback():
        run_both(fn, torch.randn(3), torch.randn(5, 3))


def _compiled_scan(init, xs, w, scale):
    def combine(c, x):
        h = c * scale + torch.tanh(x @ w)
        return h, h.sum(-1)

    carry, ys = torch._higher_order_ops.scan(combine, init, xs)
    mapped = torch._higher_order_ops.map(lambda x, w: (x @ w).sin(), xs, w)
    return carry.sum() + ys.pow(2).sum() + mapped.sum()


def _backward_and_sync(fn, *args):
    fn(*args).backward()
    lazytpu.sync()


def test_scan_and_map_in_a_compiled_function_are_one_program():
    """``lax.scan`` and ``lax.map`` (Note [Control flow]), forward and backward
    (a reversed scan and a map of their own): nothing runs op by op, one
    program for the forward and one for the backward, gradients as CPU's."""
    compiled = torch.compile(_compiled_scan, backend="tpu")
    gen = torch.Generator().manual_seed(0)
    for length in (5, 5, 1):  # a scan of one step too
        init, xs, w = (torch.randn(s, generator=gen, dtype=torch.float64) for s in ((3, 4), (length, 3, 4), (4, 4)))
        scale = torch.tensor(0.5, dtype=torch.float64)  # a 0-d carry coefficient
        inputs = [t.requires_grad_() for t in (init, xs, w)]
        expected = _compiled_scan(*inputs, scale)
        expected.backward()
        on_tpu = [to_tpu(t) for t in inputs]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing runs op by op

            step = functools.partial(_backward_and_sync, compiled, *on_tpu, to_tpu(scale))
            step()
        for got, want in zip(on_tpu, inputs):
            assert_close(got.grad.cpu(), want.grad)
            got.grad = None
        assert programs_run(step) == 2  # the forward's, the backward's
        assert_close(on_tpu[0].grad.cpu(), inputs[0].grad)


# torch refuses tpu itself, before the HOP runs: its own error, as on any device it does not list
REFUSED = {"inline_asm_elementwise": (RuntimeError, "inline_asm_elementwise only supports CUDA tensors")}


def _moved(a):
    """A sample's argument on tpu (a flex_attention ``BlockMask``, which runs on tpu since
    Note [FlexAttention on tpu], by its own ``to``)."""
    return a.to("tpu") if type(a).__name__ == "BlockMask" else to_tpu(a)


@pytest.mark.parametrize("op", hop_db, ids=lambda op: f"{op.name}.{op.variant_test_name}")
def test_hop_db_samples_match_cpu(op):
    """PyTorch's OpInfo entries of its HOPs (torch.testing._internal.hop_db);
    inputs an op writes in place are compared after the call too.
    ``auto_functionalize`` calls a custom op of PyTorch's test library that
    has a CPU kernel only: that op runs on CPU, as any such user op does."""
    guard = contextlib.nullcontext if op.name == "auto_functionalize" else no_fallback
    requires_grad = op.name == "register_hook"  # it registers a hook on its input
    for sample in list(op.sample_inputs("cpu", torch.float32, requires_grad=requires_grad))[:3]:
        args = (sample.input, *sample.args)
        tpu_args = [_moved(a) for a in args]
        if op.name in REFUSED:
            error, message = REFUSED[op.name]
            with pytest.raises(error, match=message):
                op(*tpu_args, **sample.kwargs)
            continue
        expected = op(*args, **sample.kwargs)
        with guard():
            actual = op(*tpu_args, **sample.kwargs)
        assert_close(to_cpu(actual), to_cpu(expected))
        inputs = [(got, want) for got, want in zip(tpu_args, args) if type(want).__name__ != "BlockMask"]
        assert_close(to_cpu([g for g, _ in inputs]), to_cpu([w for _, w in inputs]))
