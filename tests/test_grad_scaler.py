"""torch.amp.GradScaler("tpu") against GradScaler("cpu"): its two ops on device, in place.

Note [GradScaler ops] in lazytpu.lowering.amp says what the ops compute; the
in-place route writes every argument they write (Note [Several written
arguments] in lazytpu.frontend.routes.inplace).
"""

from __future__ import annotations

import re

import pytest
import torch
from conftest import assert_close, mode, no_fallback
from torch import nn

import lazytpu

INIT_SCALE = 2.0**8
GROWTH_INTERVAL = 2
STEPS = 6
INF_STEP = 2  # a gradient is made inf after this step's backward: the step is skipped, the scale halves
# With the inf at step 2 and growth every 2 clean steps: grow, skip and halve, grow again.
SCALES = [256.0, 512.0, 256.0, 256.0, 512.0, 512.0]
TRACKERS = [1, 0, 0, 1, 0, 1]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, 5, 4, generator=g), torch.randn(STEPS, 5, 2, generator=g)


def _train(device: str, *, clip: bool = False, autocast_dtype=None, optimizer=torch.optim.SGD):
    """A few scaled steps; per step (loss, scale, growth tracker), then the parameters."""
    model = _model().to(device)
    opt = optimizer(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device, init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    xs, ys = _data()
    history = []
    for i in range(STEPS):
        x, y = xs[i].to(device), ys[i].to(device)
        opt.zero_grad()
        with torch.autocast(device, dtype=autocast_dtype or torch.float16, enabled=autocast_dtype is not None):
            loss = nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        if i == INF_STEP:
            model[0].weight.grad[1, 2] = float("inf")
        if clip:
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        scaler.step(opt)
        scaler.update()
        history.append((loss.detach().cpu(), scaler._scale.cpu().clone(), scaler._growth_tracker.cpu().clone()))
    return history, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("clip", [False, True], ids=["step", "unscale_clip_step"])
@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam], ids=["sgd", "adam"])
def test_training_matches_cpu_scaler(clip, optimizer, eager_mode):
    expected = _train("cpu", clip=clip, optimizer=optimizer)
    with mode(eager_mode), no_fallback():
        actual = _train("tpu", clip=clip, optimizer=optimizer)
    assert [s.item() for _, s, _ in expected[0]] == SCALES
    assert [t.item() for _, _, t in expected[0]] == TRACKERS
    assert_close(actual, expected)


def test_autocast_float16_training():
    """float16 autocast on tpu: the scaler's bookkeeping is CPU's (it only sees which step
    had the inf), the losses stay close to CPU's float32 run."""
    expected = _train("cpu")
    with no_fallback():
        history, params = _train("tpu", autocast_dtype=torch.float16)
    assert [s.item() for _, s, _ in history] == SCALES
    assert [t.item() for _, _, t in history] == TRACKERS
    assert_close([loss for loss, _, _ in history], [loss for loss, _, _ in expected[0]], rtol=0, atol=2e-2)
    assert_close(params, expected[1], rtol=0, atol=2e-2)


def _syncs_of_steps(scaled: bool) -> list[dict]:
    """The syncs of each step of a defer training loop, by reason."""
    model = _model().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("tpu", init_scale=INIT_SCALE, growth_interval=GROWTH_INTERVAL, enabled=scaled)
    xs, ys = _data()
    out = []
    for i in range(STEPS):
        x, y = xs[i].to("tpu"), ys[i].to("tpu")
        before = dict(lazytpu.metrics.snapshot()["syncs"])
        opt.zero_grad()
        scaler.scale(nn.functional.mse_loss(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        after = lazytpu.metrics.snapshot()["syncs"]
        out.append({k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)})
    return out


# The sync reasons that wait for a value (docs/sync_points.md).
WAITING = {"item", "tolist", "cpu", "synchronize", "cpu_fallback", "data_dependent", "rng_state"}


def test_one_host_read_per_step():
    """GradScaler.step reads found_inf once (``.item()`` in torch's own code): the only
    sync that waits in a scaled step, which an unscaled step does not have; the scaler
    adds no other flush, and nothing falls back to CPU."""
    with mode("defer"), no_fallback():
        scaled, plain = _syncs_of_steps(True), _syncs_of_steps(False)
    for with_scaler, without in zip(scaled, plain):
        assert {k: n for k, n in with_scaler.items() if k in WAITING} == {"item": 1}, with_scaler
        assert not WAITING & set(without), without
        assert sum(with_scaler.values()) <= sum(without.values()) + 1, (with_scaler, without)


GRAD_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.mark.parametrize("dtype", GRAD_DTYPES)
@pytest.mark.parametrize("bad", [None, float("inf"), float("-inf"), float("nan")], ids=["finite", "inf", "-inf", "nan"])
def test_unscale_op_matches_cpu(dtype, bad, eager_mode):
    """Gradients times inv_scale in place, found_inf set only when a value is not finite
    (and kept at 1 once set); the op returns nothing."""
    torch.manual_seed(0)
    grads = [(torch.randn(3, 4) * 1000).to(dtype), (torch.randn(5) * 100).to(dtype)]
    if bad is not None:
        grads[1][3] = bad

    def run(device):
        gs = [g.clone().to(device) for g in grads]
        found = torch.zeros((), device=device)
        inv = torch.full((), 1 / 8, device=device)
        assert torch._amp_foreach_non_finite_check_and_unscale_(gs[:1], found, inv) is None
        first = found.clone()
        torch._amp_foreach_non_finite_check_and_unscale_(gs[1:], found, inv)
        torch._amp_foreach_non_finite_check_and_unscale_(gs[:1], found, inv)  # a clean list keeps found_inf
        return [g.cpu() for g in gs], first.cpu(), found.cpu()

    expected = run("cpu")
    with mode(eager_mode), no_fallback():
        actual = run("tpu")
    assert expected[2].item() == (0.0 if bad is None else 1.0)
    assert_close(actual, expected)


@pytest.mark.parametrize("found", [0.0, 1.0, float("nan")], ids=["clean", "found", "nan"])
@pytest.mark.parametrize("tracker", [0, 2, 5])
@pytest.mark.parametrize("scale", [1024.0, 3.0e38], ids=["1024", "near_max"])
def test_update_scale_op_matches_cpu(found, tracker, scale, eager_mode):
    """Backoff on a found inf (nan counts), growth when the tracker reaches the interval
    (not past float32's range), the tracker counted or reset; returns its scale argument."""

    def run(device):
        s = torch.full((1,), scale, device=device)
        t = torch.full((1,), tracker, dtype=torch.int32, device=device)
        out = torch._amp_update_scale_(s, t, torch.full((1,), found, device=device), 1.5, 0.25, 3)
        assert out is s
        return s.cpu(), t.cpu()

    expected = run("cpu")
    with mode(eager_mode), no_fallback():
        assert_close(run("tpu"), expected, rtol=0, atol=0)


def test_update_scale_sequence_matches_cpu():
    """One scale and tracker updated over many steps, 0-d as GradScaler makes them."""
    founds = [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0]

    def run(device):
        s = torch.full((), 65536.0, device=device)
        t = torch.zeros((), dtype=torch.int32, device=device)
        seen = []
        for f in founds:
            torch._amp_update_scale_(s, t, torch.full((), float(f), device=device), 2.0, 0.5, 3)
            seen.append((s.cpu().clone(), t.cpu().clone()))
        return seen

    expected = run("cpu")
    with no_fallback():
        assert_close(run("tpu"), expected, rtol=0, atol=0)


ERRORS = {
    "found_inf_int": lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
        [torch.ones(2, device=d)], torch.zeros((), dtype=torch.int64, device=d), torch.ones((), device=d)
    ),
    "inv_scale_two_elements": lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
        [torch.ones(2, device=d)], torch.zeros((), device=d), torch.ones(2, device=d)
    ),
    "inv_scale_double": lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
        [torch.ones(2, device=d)], torch.zeros((), device=d), torch.ones((), dtype=torch.float64, device=d)
    ),
    "integer_grads": lambda d: torch._amp_foreach_non_finite_check_and_unscale_(
        [torch.ones(2, dtype=torch.int64, device=d)], torch.zeros((), device=d), torch.ones((), device=d)
    ),
    "tracker_float": lambda d: torch._amp_update_scale_(
        torch.ones((), device=d), torch.zeros((), device=d), torch.zeros((), device=d), 2.0, 0.5, 2
    ),
    "scale_double": lambda d: torch._amp_update_scale_(
        torch.ones((), dtype=torch.float64, device=d),
        torch.zeros((), dtype=torch.int32, device=d),
        torch.zeros((), device=d),
        2.0,
        0.5,
        2,
    ),
    "scale_two_elements": lambda d: torch._amp_update_scale_(
        torch.ones(2, device=d), torch.zeros((), dtype=torch.int32, device=d), torch.zeros((), device=d), 2.0, 0.5, 2
    ),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors_match_cpu(name):
    with pytest.raises((RuntimeError, NotImplementedError)) as cpu:
        ERRORS[name]("cpu")
    with no_fallback(), pytest.raises(cpu.type, match=f"^{re.escape(str(cpu.value))}$"):
        ERRORS[name]("tpu")
