"""Sync points, one program per sync, DCE and the canonical program key."""

from __future__ import annotations

import pytest
import torch
from conftest import programs_run

import lazytpu
from lazytpu import _config


def _syncs() -> dict:
    return lazytpu.metrics.snapshot()["syncs"]


@pytest.mark.parametrize(
    "read, reason",
    [
        (lambda t: t.cpu(), "cpu"),
        (lambda t: t.sum().item(), "item"),
        (lambda t: t.tolist(), "tolist"),
        (lambda t: bool(t.sum() > 0), "item"),
        (lambda t: repr(t), "cpu"),
        (lambda t: torch.tpu.synchronize(), "synchronize"),
        (lambda t: lazytpu.sync(), "lazytpu.sync"),
    ],
)
def test_each_sync_point_materializes(read, reason):
    x = torch.ones(4).to("tpu")
    y = x * 3 + 1
    assert y._lt_storage.pending
    lazytpu.metrics.reset()
    read(y)
    assert not y._lt_storage.pending
    assert lazytpu.metrics.snapshot()["programs_executed"] >= 1
    if reason is not None:
        assert _syncs().get(reason, 0) >= 1


def test_one_program_materializes_every_live_tensor():
    x = torch.randn(8).to("tpu")
    lazytpu.sync()
    a, b, c = x + 1, x * 2, (x + 1) * (x * 2)
    lazytpu.metrics.reset()
    c.cpu()
    assert lazytpu.metrics.snapshot()["programs_executed"] == 1
    assert not a._lt_storage.pending and not b._lt_storage.pending
    assert programs_run(lambda: (a.cpu(), b.cpu())) == 0


def test_dead_tensors_are_never_computed():
    x = torch.randn(13).to("tpu")  # a shape no other test compiles
    lazytpu.sync()
    lazytpu.metrics.reset()
    keep = x + 1
    dead = x * 100  # noqa: F841
    del dead
    keep.cpu()
    assert lazytpu.metrics.snapshot()["programs_compiled"] == 1
    # one recorded op reached the program; its key has a single node (Note [Flat program keys])
    from lazytpu.ir.node import OpSig
    from lazytpu.runtime.executor import _CACHE

    last_key = list(_CACHE.entries)[-1]
    program_key, _donated, _device, _precision = last_key
    assert [type(part) for part in program_key[0]] == [OpSig, int, int]


def test_program_cache_hits_whatever_the_buffers():
    def step(a, b):
        return (a * b + 2).cpu()

    x, y = torch.randn(6).to("tpu"), torch.randn(6).to("tpu")
    step(x, y)
    lazytpu.metrics.reset()
    u, v = torch.randn(6).to("tpu"), torch.randn(6).to("tpu")
    step(u, v)
    snap = lazytpu.metrics.snapshot()
    assert snap["programs_compiled"] == 0 and snap["cache_hits"] == 1


def test_x_plus_x_differs_from_x_plus_y():
    x, y = torch.randn(6).to("tpu"), torch.randn(6).to("tpu")
    (x + y).cpu()
    lazytpu.metrics.reset()
    torch.testing.assert_close((x + x).cpu(), 2 * x.cpu())
    assert lazytpu.metrics.snapshot()["programs_compiled"] == 1


def test_new_shape_recompiles():
    (torch.randn(3).to("tpu") + 1).cpu()
    lazytpu.metrics.reset()
    (torch.randn(5).to("tpu") + 1).cpu()
    assert lazytpu.metrics.snapshot()["programs_compiled"] == 1


def test_changing_float_does_not_recompile():
    # compiled in as a constant first, lifted once it changes (Note [Scalar specialization])
    x = torch.randn(4).to("tpu")
    (x * 0.5).cpu()
    (x * 0.25).cpu()
    lazytpu.metrics.reset()
    for lr in (0.1, 0.2, 0.3):
        torch.testing.assert_close((x * lr).cpu(), x.cpu() * lr)
    assert lazytpu.metrics.snapshot()["programs_compiled"] == 0


def test_int64_and_float64_survive():
    big = torch.tensor([2**40 + 1, -(2**50)], dtype=torch.int64)
    assert (big.to("tpu") + 1).cpu().tolist() == [2**40 + 2, -(2**50) + 1]
    f = torch.tensor([1.0 + 1e-12], dtype=torch.float64)
    assert (f.to("tpu") * 1.0).cpu().item() == 1.0 + 1e-12


def _sgd_loop(steps: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8).to("tpu")
    for _ in range(steps):
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
    return model


@pytest.mark.parametrize("segments", [True, False], ids=["segments", "whole"])
def test_optimizer_step_is_a_sync_point(segments):
    with _config.STEP_SEGMENTS.override(segments):
        _sgd_loop(2)
        lazytpu.metrics.reset()
        model = _sgd_loop(3)
        snap = lazytpu.metrics.snapshot()
        assert snap["syncs"].get("optimizer_step") == 3
        assert snap["syncs"].get("segment", 0) == (6 if segments else 0)  # Note [Step segments]
        # each step's (last) program is dispatched at the next op; the last one's at this read (Note [Step boundary])
        per_step = 3 if segments else 1
        assert snap["programs_executed"] == 3 * per_step - 1
        model.weight.cpu()
        assert lazytpu.metrics.snapshot()["programs_executed"] == 3 * per_step


def _spy_outputs(monkeypatch) -> list:
    """The output shapes of every program built from now on."""
    from lazytpu import engine_flush

    shapes, build = [], engine_flush.build_program

    def spy(roots, **options):
        built = build(roots, **options)
        shapes.append(sorted(tuple(a.shape) for a in built[0].output_avals))
        return built

    monkeypatch.setattr(engine_flush, "build_program", spy)
    return shapes


def test_a_steps_program_does_not_write_gradients_the_loop_drops(monkeypatch):
    """``zero_grad(set_to_none=True)`` frees the gradients before the next op dispatches
    the step's program, so they are not among its outputs (Note [Step boundary]);
    with step segments the backward's program writes them for the update's."""
    for segments, counts in ((False, [1, 1, 2]), (True, [0, 1, 1] * 3)):
        with _config.STEP_SEGMENTS.override(segments):
            _sgd_loop(2)
            shapes = _spy_outputs(monkeypatch)
            model = _sgd_loop(3)
            lazytpu.sync()  # the last step's gradients are still in .grad: written
        weight = (2, 8)
        # the updated weight (and its gradient); segments: the forward, the backward (the gradient), the update
        assert [s.count(weight) for s in shapes] == counts, segments
        assert model.weight.grad is not None


@pytest.mark.parametrize("segments", [True, False], ids=["segments", "whole"])
def test_a_step_writes_the_gradients_still_referenced(monkeypatch, segments):
    monkeypatch.setattr(_config.STEP_SEGMENTS, "value", segments)
    torch.manual_seed(0)
    cpu = torch.nn.Linear(8, 2)
    model = torch.nn.Linear(8, 2)
    model.load_state_dict(cpu.state_dict())
    model = model.to("tpu")
    x = torch.randn(4, 8)
    shapes = _spy_outputs(monkeypatch)
    for m, inp in ((cpu, x), (model, x.to("tpu"))):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            m(inp).square().sum().backward()
            opt.step()
            kept = [p.grad for p in m.parameters()]  # read after the step, e.g. to log a norm
    last_step = shapes[-3:] if segments else shapes[-1:]  # segments: the backward writes the gradient
    assert sum(s.count((2, 8)) for s in last_step) == 2  # the weight and its gradient
    for got, want in zip(kept, [p.grad for p in cpu.parameters()]):
        torch.testing.assert_close(got.cpu(), want)


def test_a_host_copy_or_a_view_does_not_dispatch_the_step():
    model = _sgd_loop(2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(4, 8).to("tpu")).sum()
    loss.backward()
    opt.step()
    before = lazytpu.metrics.snapshot()["programs_executed"]
    loss.detach()
    batch = torch.randn(4, 8).to("tpu")
    opt.zero_grad()
    assert lazytpu.metrics.snapshot()["programs_executed"] == before
    model(batch)  # the next step's first op
    assert lazytpu.metrics.snapshot()["programs_executed"] == before + 1


def test_optimizer_step_sync_can_be_turned_off():
    from lazytpu import _config

    with _config.SYNC_ON_OPTIMIZER_STEP.override(False):
        lazytpu.metrics.reset()
        _sgd_loop(3)
        assert "optimizer_step" not in lazytpu.metrics.snapshot()["syncs"]
    lazytpu.sync()


def test_graph_cap_bounds_pending_ops():
    x = torch.zeros(4).to("tpu")
    with _config.MAX_PENDING_OPS.override(50):
        lazytpu.metrics.reset()
        for _ in range(120):
            x = x + 1
        # cut at 50 pending ops, then at the same op once 25 are pending (Note [Graph depth])
        assert lazytpu.metrics.snapshot()["syncs"].get("graph_cap") == 3
    assert x.cpu().tolist() == [120.0] * 4


def test_graph_cap_bounds_the_depth_of_a_chain_of_writes_through_views():
    """``x[i] = v[i]`` in a loop is a chain of window writes, one deep each: cut by the
    depth cap as other chains are (it was not: one 4,000-op program at the first read,
    11 s and 1.9 GB to compile for 2,000 writes)."""
    x = torch.zeros(10, 3).to("tpu")
    v = torch.arange(30.0).reshape(10, 3).to("tpu")
    lazytpu.sync()
    with _config.MAX_PENDING_DEPTH.override(100):
        lazytpu.metrics.reset()
        for i in range(120):
            x[i % 10] = v[i % 10] + i
        assert lazytpu.metrics.snapshot()["syncs"].get("graph_cap", 0) >= 1
    expected = torch.zeros(10, 3)
    for i in range(120):
        expected[i % 10] = torch.arange(30.0).reshape(10, 3)[i % 10] + i
    assert torch.equal(x.cpu(), expected)


def test_graph_cap_bounds_the_depth_of_what_is_pending():
    """A chain of dependent ops that never syncs is cut every
    LAZYTPU_MAX_PENDING_DEPTH ops (XLA's compile time grows faster than linearly
    with depth: Note [Graph depth]); as many independent ops are not cut."""
    assert _config.MAX_PENDING_DEPTH.get() == 500  # the default
    x = torch.zeros(4).to("tpu")
    lazytpu.sync()
    with _config.MAX_PENDING_DEPTH.override(100):  # small programs: a fast test
        lazytpu.metrics.reset()
        y = x
        for _ in range(240):
            y = y + 1
        assert lazytpu.metrics.snapshot()["syncs"] == {"graph_cap": 3}  # at depth 100, 150 and 200
        assert y.cpu().tolist() == [240.0] * 4
        lazytpu.metrics.reset()
        wide = [x + i for i in range(240)]  # 240 ops, each one deep
        assert lazytpu.metrics.snapshot()["syncs"] == {}
        assert torch.stack(wide).sum().item() == 4 * sum(range(240))


def _periodic_loop(y, rounds: int):
    for _ in range(rounds):  # 7 dependent ops a round: the cap of 100 falls at a different op each time
        y = torch.tanh(y)
        y = y * 0.5
        y = y + 1
        y = torch.sin(y)
        y = y * 2
        y = torch.cos(y)
        y = y - 0.25
    return y


def test_graph_cap_cuts_a_loop_that_never_syncs_where_it_cut_before():
    """The graph cap cuts a loop that never syncs (a diffusion model's
    denoising loop) again at the op where it cut last, once past half the
    cap: every program after the first is the same one, a cache hit. At a
    fixed depth the cut fell at another op of the loop each time, and each
    program compiled anew (diffusers' UNet2DModel, Euler, 30 steps: a compile
    every 3.5 steps, to the end; now none after step 7)."""
    x = torch.rand(4, 4)
    y = x.to("tpu")
    lazytpu.sync()
    with _config.MAX_PENDING_DEPTH.override(100):
        lazytpu.metrics.reset()
        y = _periodic_loop(y, 200)  # 1,400 ops deep
        snap = lazytpu.metrics.snapshot()
        assert snap["syncs"] == {"graph_cap": 24}  # at depth 100, then every 8 rounds (56 deep)
        assert snap["programs_compiled"] == 2 and snap["cache_hits"] == 22
    torch.testing.assert_close(y.cpu(), _periodic_loop(x, 200))
