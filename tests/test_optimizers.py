"""torch.optim on ``tpu``: 50 steps match CPU (defaults and foreach paths),
zero_grad both ways, gradient clipping, LR schedulers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lazytpu

OPTIMIZERS = {
    "sgd_momentum": lambda p, **kw: torch.optim.SGD(p, lr=0.05, momentum=0.9, **kw),
    "sgd_nesterov": lambda p, **kw: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3, **kw),
    "adam": lambda p, **kw: torch.optim.Adam(p, lr=1e-2, **kw),
    "adamw": lambda p, **kw: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, **kw),
    "rmsprop": lambda p, **kw: torch.optim.RMSprop(p, lr=1e-3, momentum=0.5, **kw),
    "adagrad": lambda p, **kw: torch.optim.Adagrad(p, lr=0.05, **kw),
}


def _run(device, make_opt, foreach, set_to_none, steps=50):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(device)
    kwargs = {} if foreach is None else {"foreach": foreach}
    opt = make_opt(model.parameters(), **kwargs)
    sched = torch.optim.lr_scheduler.OneCycleLR(
        opt, max_lr=opt.param_groups[0]["lr"] * 2, total_steps=steps, cycle_momentum=False
    )
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 6, generator=gen).to(device), torch.randint(0, 3, (12,), generator=gen).to(device)
    for _ in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.5)
        opt.step()
        sched.step()
    return [p.detach().cpu() for p in model.parameters()], loss.detach().cpu()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("foreach", [None, True])
def test_optimizer_matches_cpu(name, foreach):
    set_to_none = foreach is None  # both zero_grad forms across the table
    lazytpu.metrics.reset()
    tpu_params, tpu_loss = _run("tpu", OPTIMIZERS[name], foreach, set_to_none)
    cpu_params, cpu_loss = _run("cpu", OPTIMIZERS[name], foreach, set_to_none)
    torch.testing.assert_close(tpu_loss, cpu_loss, rtol=1e-4, atol=1e-5)
    for a, b in zip(tpu_params, cpu_params):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


@pytest.mark.parametrize("name", ["adam", "adamw", "rmsprop"])
def test_capturable_foreach_step_with_a_tensor_lr_matches_cpu(name):
    """torch.optim's capturable foreach path divides by the CPU tensor lr
    (``_foreach_div_(list, lr)``); CPU's reference is its plain loop."""
    make = OPTIMIZERS[name]

    def capturable(params, **kw):
        opt = make(list(params), capturable=True, **kw)
        for group in opt.param_groups:
            group["lr"] = torch.tensor(group["lr"])
        return opt

    lazytpu.metrics.reset()
    tpu_params, tpu_loss = _run("tpu", capturable, True, True, steps=5)
    cpu_params, cpu_loss = _run("cpu", make, False, True, steps=5)
    torch.testing.assert_close(tpu_loss, cpu_loss, rtol=1e-4, atol=1e-5)
    for a, b in zip(tpu_params, cpu_params):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


def test_strict_mode_sgd_matches_cpu():
    with torch.tpu.set_eager_mode("strict"):
        tpu_params, _ = _run("tpu", OPTIMIZERS["sgd_momentum"], None, True, steps=10)
    cpu_params, _ = _run("cpu", OPTIMIZERS["sgd_momentum"], None, True, steps=10)
    for a, b in zip(tpu_params, cpu_params):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_lr_schedule_does_not_recompile():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=20)
    x = torch.randn(8, 4).to("tpu")
    compiled = []
    for _ in range(8):
        before = lazytpu.metrics.snapshot()["programs_compiled"]
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        sched.step()
        compiled.append(lazytpu.metrics.snapshot()["programs_compiled"] - before)
    # the update of a changing rate is compiled once more, then never (Note [Scalar specialization])
    assert compiled[3] <= 1 and compiled[4:] == [0] * 4, compiled


def test_out_resize_warns_like_cpu():
    import warnings

    for device in ("cpu", "tpu"):
        out = torch.zeros(2).to(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.add(torch.ones(3).to(device), 1, out=out)
        assert out.shape == (3,) and out.cpu().tolist() == [2.0, 2.0, 2.0]
        assert any("An output with one or more elements was resized" in str(w.message) for w in caught), device
        empty = torch.empty(0).to(device)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.mul(torch.ones(2, 2).to(device), 3, out=empty)
        assert empty.shape == (2, 2) and not caught
