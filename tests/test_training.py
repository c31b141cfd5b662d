"""Training loops on ``tpu`` match the same run on CPU torch."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import lazytpu
from lazytpu import _config


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5))


def _train(model, make_opt, xs, ys, device: str, steps: int = 20) -> tuple[list[float], dict]:
    model = model.to(device)
    opt = make_opt(model.parameters())
    losses = []
    for step in range(steps):
        x, y = xs[step % len(xs)].to(device), ys[step % len(ys)].to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [float(v.cpu()) for v in losses], {k: v.detach().cpu() for k, v in model.state_dict().items()}


OPTIMIZERS = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "sgd_momentum_foreach": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, foreach=True),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
    "adam_foreach": lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True),
}


@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_mlp_matches_cpu(opt_name, mode):
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(16, 20, generator=gen) for _ in range(4)]
    ys = [torch.randint(0, 5, (16,), generator=gen) for _ in range(4)]
    model = _mlp()
    cpu_losses, cpu_state = _train(copy.deepcopy(model), OPTIMIZERS[opt_name], xs, ys, "cpu")
    lazytpu.metrics.reset()
    with torch.tpu.set_eager_mode(mode):
        tpu_losses, tpu_state = _train(copy.deepcopy(model), OPTIMIZERS[opt_name], xs, ys, "tpu")
    torch.testing.assert_close(torch.tensor(tpu_losses), torch.tensor(cpu_losses), rtol=1e-5, atol=1e-5)
    for name, value in cpu_state.items():
        torch.testing.assert_close(tpu_state[name], value, rtol=1e-5, atol=1e-5)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}
    assert cpu_losses[-1] < cpu_losses[0]


def test_foreach_ops_lower_without_fallback():
    ts = [torch.randn(3, 4), torch.randn(5)]
    us = [torch.randn(3, 4), torch.randn(5)]
    lazytpu.metrics.reset()
    a, b = [t.to("tpu") for t in ts], [u.to("tpu") for u in us]
    torch._foreach_add_(a, b, alpha=0.5)
    torch._foreach_mul_(a, 2.0)
    outs = torch._foreach_sqrt(torch._foreach_abs(a))
    torch._foreach_addcmul_(a, b, b, value=0.1)
    torch._foreach_lerp_(a, b, 0.3)
    exp = [t.clone() for t in ts]
    torch._foreach_add_(exp, us, alpha=0.5)
    torch._foreach_mul_(exp, 2.0)
    exp_outs = torch._foreach_sqrt(torch._foreach_abs(exp))
    torch._foreach_addcmul_(exp, us, us, value=0.1)
    torch._foreach_lerp_(exp, us, 0.3)
    for x, e in zip(list(a) + list(outs), list(exp) + list(exp_outs)):
        torch.testing.assert_close(x.cpu(), e)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


@pytest.mark.parametrize("segments", [True, False], ids=["segments", "whole"])
def test_defer_training_step_is_its_segments(segments):
    """A step is three programs, cut at the start of the backward and of
    optimizer.step() (Note [Step segments]; one with LAZYTPU_STEP_SEGMENTS=0),
    each a cache hit once warm, and the parameters are CPU torch's."""
    cpu_model = _mlp()
    model = copy.deepcopy(cpu_model).to("tpu")
    x, y = torch.randn(8, 20), torch.randint(0, 5, (8,))
    runs = []
    for m, xs, ys in ((cpu_model, x, y), (model, x.to("tpu"), y.to("tpu"))):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)

        def step(m=m, opt=opt, xs=xs, ys=ys):
            opt.zero_grad()
            loss = F.cross_entropy(m(xs), ys)
            loss.backward()
            opt.step()
            return loss

        runs.append((m, step))
    with _config.STEP_SEGMENTS.override(segments):
        for _ in range(2):  # the first step's programs differ
            for _, step in runs:
                step().item()
        lazytpu.metrics.reset()
        losses = [step().item() for _, step in runs]
    snap = lazytpu.metrics.snapshot()
    assert snap["programs_executed"] == (3 if segments else 1)
    assert snap["syncs"].get("segment", 0) == (2 if segments else 0)
    assert snap["programs_compiled"] == 0 and snap["cpu_fallbacks"] == {}
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    for a, b in zip(cpu_model.parameters(), model.parameters()):
        torch.testing.assert_close(b.cpu(), a)
