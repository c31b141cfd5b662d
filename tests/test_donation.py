"""Buffer donation: a buffer nothing needs after a program is reused by it
(Note [Donation]); a buffer another tensor still reads is never donated."""

from __future__ import annotations

import gc

import jax
import pytest
import torch

import lazytpu
from lazytpu import _config


def _buffer(t):
    lazytpu.sync()
    return t._lt_storage.value.buffer


def _train(steps: int, model, opt, x):
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    lazytpu.sync()


def test_updated_parameter_buffer_is_donated():
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(8, 64).to("tpu")
    _train(2, model, opt, x)
    old = _buffer(model.weight)
    _train(1, model, opt, x)
    assert old.is_deleted()  # its memory went to the new weight


def test_live_buffers_stay_flat_across_steps():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(16, 32).to("tpu")
    _train(3, model, opt, x)
    counts = []
    for _ in range(5):
        _train(1, model, opt, x)
        torch.tpu.synchronize()
        gc.collect()
        counts.append((len(jax.live_arrays()), sum(a.nbytes for a in jax.live_arrays())))
    # Flat: nothing accumulates from step to step. (The first count may still hold arrays that
    # earlier tests left to the garbage collector and the next sync releases; it is never below.)
    assert len(set(counts[1:])) == 1 and counts[0] >= counts[-1], counts


def test_buffer_still_read_elsewhere_is_not_donated():
    a = torch.arange(4.0).to("tpu")
    b = torch.zeros(4).to("tpu")
    lazytpu.sync()
    b.copy_(a)  # b now holds a's buffer
    lazytpu.sync()
    shared = a._lt_storage.value.buffer
    a.add_(1)
    lazytpu.sync()
    assert not shared.is_deleted()
    assert b.cpu().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert a.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_alias_of_updated_tensor_sees_new_value():
    p = torch.ones(3).to("tpu")
    alias = p.detach()
    lazytpu.sync()
    p.mul_(3)
    lazytpu.sync()
    assert alias.cpu().tolist() == [3.0, 3.0, 3.0]


def _assert_matches_cpu(run, mode=None):
    """``run(device)``'s host tensors on tpu (in eager ``mode``, else under the graph cap of 1) equal CPU torch's."""
    want = run("cpu")
    with torch.tpu.set_eager_mode(mode) if mode else _config.MAX_PENDING_OPS.override(1):
        got = run("tpu")
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


def _base(device):
    return torch.arange(24.0).reshape(4, 6).to(device) - 8


def _copy_from_own_view(device):
    base = _base(device)
    base.cpu()
    base.copy_(base)
    v = base[:, 4:5]
    base.copy_(v)  # base's value now reads its old buffer, which no storage holds any more
    c = v.contiguous()  # reads base through v: must not donate that old buffer before c is computed
    v.fill_(3.0)
    return base.cpu(), c.cpu()


def _two_views_of_pending_base(device):
    base = _base(device)
    base.cpu()
    base.copy_(base[:, 1:2])
    return (torch.add(base[:, 0:3], base[:, 3:6]).cpu(),)


def _self_copies(device):
    base = _base(device)
    base.cpu()
    base.copy_(base)
    base[:, :3].copy_(base[:, 3:])  # from a view of itself into another
    base[1].copy_(base[1])  # a view into itself
    base.mul_(2)
    row = base[2]
    base[:2].copy_(base[2:])  # rows from other rows of itself
    return base.cpu(), row.contiguous().cpu()


@pytest.mark.parametrize("mode", ["strict", "defer"])
@pytest.mark.parametrize("run", [_copy_from_own_view, _two_views_of_pending_base, _self_copies])
def test_copies_within_one_storage_match_cpu(run, mode):
    # A buffer no storage holds any more, but which a view's pending read still needs, is not donated early.
    _assert_matches_cpu(run, mode)


def test_graph_cap_flush_while_reading_views():
    # A flush at the graph cap between an op's view reads must not donate what an earlier read needs.
    _assert_matches_cpu(_copy_from_own_view)
    _assert_matches_cpu(_two_views_of_pending_base)


def test_view_read_still_donates_the_old_buffer():
    # Strict mode: the program that computes ``c`` also materializes ``base``; the old buffer goes to it.
    with torch.tpu.set_eager_mode("strict"):
        base = _base("tpu")
        old = _buffer(base)
        base.copy_(base[:, 4:5])
        c = base[:, 1:2].contiguous()
        lazytpu.sync()
        assert old.is_deleted()
        assert c.cpu().flatten().tolist() == [-4.0, 2.0, 8.0, 14.0]


def _compiled_mutation_of_view_and_tensor(device):
    def step(a, b):
        a.add_(1)
        b.mul_(2)
        return a.sum()

    run = torch.compile(step, backend="tpu") if device == "tpu" else step
    base = torch.arange(8.0).to(device)
    other = torch.arange(4.0).to(device)
    base.cpu()
    other.copy_(base[4:])  # ``other`` now reads base's buffer too
    # binding the view's result must not donate base's buffer before ``other``'s result, which reads it, is bound
    total = run(base[:4], other)
    return base.cpu(), other.cpu(), total.cpu()


@pytest.mark.parametrize("mode", ["strict", "defer"])
def test_compiled_program_mutating_a_view_and_a_tensor(mode):
    _assert_matches_cpu(_compiled_mutation_of_view_and_tensor, mode)
