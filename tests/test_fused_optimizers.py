"""``fused=True`` optimizers on ``tpu`` (Note [Fused optimizers]): CPU torch's
fused kernels' numbers, recorded on device (they ran on CPU, copying every
parameter and state tensor to the host and back at each step)."""

from __future__ import annotations

import pytest
import torch
from conftest import no_fallback

import lazytpu

N = 37  # a vector body and a tail in CPU's kernels


def _state(device, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def make(scale=1.0, positive=False):
        t = torch.randn(N, generator=gen)
        return ((t.abs() if positive else t) * scale).to(dtype).to(device)

    return make(), make(), make(0.1), make(0.01, positive=True), make(0.02, positive=True)


def _on(device, value):
    return torch.tensor(value).to(device) if isinstance(value, float) else value


def _adam(device, dtype, decoupled=False, amsgrad=False, maximize=False, wd=0.0, lr=0.01, scale=None, inf=None):
    p, g, m, v, top = _state(device, dtype)
    fn = torch._fused_adamw_ if decoupled else torch._fused_adam_
    steps = [torch.tensor(3.0, device=device)]
    lr = lr.to(device) if isinstance(lr, torch.Tensor) else lr
    fn(
        [p],
        [g],
        [m],
        [v],
        [top] if amsgrad else [],
        steps,
        lr=lr,
        beta1=0.9,
        beta2=0.999,
        weight_decay=wd,
        eps=1e-8,
        amsgrad=amsgrad,
        maximize=maximize,
        grad_scale=_on(device, scale),
        found_inf=_on(device, inf),
    )
    return [p, g, m, v, top]


def _sgd(device, dtype, momentum=0.0, nesterov=False, dampening=0.0, first=False, wd=0.0, scale=None, inf=None):
    p, g, buf, _, _ = _state(device, dtype)
    torch._fused_sgd_(
        [p],
        [g],
        [buf] if momentum else [],
        weight_decay=wd,
        momentum=momentum,
        lr=0.01,
        dampening=dampening,
        nesterov=nesterov,
        maximize=False,
        is_first_step=first,
        grad_scale=_on(device, scale),
        found_inf=_on(device, inf),
    )
    return [p, g, buf]


def _adagrad(device, dtype, wd=0.0, lr=0.01, scale=None, inf=None, maximize=False):
    p, g, _, total, _ = _state(device, dtype)
    steps = [torch.tensor(3.0, device=device)]
    lr = lr.to(device) if isinstance(lr, torch.Tensor) else lr
    torch._fused_adagrad_(
        [p],
        [g],
        [total],
        steps,
        lr=lr,
        lr_decay=0.01,
        weight_decay=wd,
        eps=1e-10,
        maximize=maximize,
        grad_scale=_on(device, scale),
        found_inf=_on(device, inf),
    )
    return [p, g, total, steps[0]]


CASES = {
    "adam": (_adam, {}),
    "adam_amsgrad_maximize_wd": (_adam, dict(amsgrad=True, maximize=True, wd=0.1)),
    "adam_grad_scale": (_adam, dict(scale=4.0, inf=0.0)),
    "adam_tensor_lr": (_adam, dict(lr=torch.tensor(0.02))),
    "adamw_wd": (_adam, dict(decoupled=True, wd=0.1)),
    "adamw_amsgrad_grad_scale": (_adam, dict(decoupled=True, amsgrad=True, wd=0.1, scale=2.0)),
    "sgd": (_sgd, {}),
    "sgd_nesterov_wd": (_sgd, dict(momentum=0.9, nesterov=True, wd=0.01)),
    "sgd_first_step": (_sgd, dict(momentum=0.9, dampening=0.1, first=True)),
    "sgd_dampening_grad_scale": (_sgd, dict(momentum=0.9, dampening=0.1, scale=2.0)),
    "adagrad": (_adagrad, {}),
    "adagrad_wd_grad_scale_maximize": (_adagrad, dict(wd=0.1, scale=8.0, maximize=True)),
    "adagrad_tensor_lr": (_adagrad, dict(lr=torch.tensor(0.02))),
}


def _ulps(got, expected):
    """The largest difference in units of the last place of ``expected``'s values."""
    info = torch.finfo(expected.dtype)
    wide = expected.double()
    ulp = (info.eps * torch.exp2(torch.floor(torch.log2(wide.abs())))).clamp_min(info.tiny)
    return ((got.cpu().double() - wide).abs() / ulp).max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_step_matches_cpus_fused_kernel(name, dtype):
    fn, options = CASES[name]
    expected = fn("cpu", dtype, **options)
    with no_fallback():
        got = fn("tpu", dtype, **options)
        got = [t.cpu() for t in got]
    for g, e in zip(got, expected, strict=True):
        # XLA:CPU contracts a * b + c into one rounding where CPU's vector code
        # rounds twice: an ulp of the terms (about 1 here), more of a cancelling sum
        eps = torch.finfo(dtype).eps
        torch.testing.assert_close(g, e, rtol=2 * eps, atol=4 * eps)


@pytest.mark.parametrize("name", ["adam_amsgrad_maximize_wd", "adamw_wd", "adagrad"])
def test_fused_step_in_bfloat16_computes_in_float32_as_cpu_does(name):
    fn, options = CASES[name]
    expected = fn("cpu", torch.bfloat16, **options)
    got = fn("tpu", torch.bfloat16, **options)
    for g, e in zip(got, expected, strict=True):
        assert _ulps(g, e) <= 1.0


def test_fused_sgd_in_bfloat16_updates_every_element():
    """CPU's fused SGD kernel in bfloat16 (torch 2.13) writes only the
    elements past its vector loop; the update here is every element's."""
    p, g, _, _, _ = _state("tpu", torch.bfloat16)
    expected = (p.cpu().float() + g.cpu().float() * -0.01).bfloat16()
    torch._fused_sgd_(
        [p],
        [g],
        [],
        weight_decay=0.0,
        momentum=0.0,
        lr=0.01,
        dampening=0.0,
        nesterov=False,
        maximize=False,
        is_first_step=False,
    )
    assert torch.equal(p.cpu(), expected)


@pytest.mark.parametrize(
    "name",
    ["adam_grad_scale", "adamw_amsgrad_grad_scale", "sgd_dampening_grad_scale", "adagrad_wd_grad_scale_maximize"],
)
def test_found_inf_leaves_every_tensor_as_it_was(name):
    fn, options = CASES[name]
    expected = fn("cpu", torch.float32, **{**options, "inf": 1.0})  # CPU's kernel returns at once
    got = fn("tpu", torch.float32, **{**options, "inf": 1.0})
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g.cpu(), e)
    assert torch.equal(got[0].cpu(), _state("cpu", torch.float32)[0])


def _train(device, cls, steps=5, **options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).to(device)
    opt = cls(model.parameters(), lr=0.05, fused=True, **options)
    schedule = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7)  # a new learning rate each step
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10, growth_interval=1)
    compiled = []
    for step in range(steps):
        x = torch.randn(4, 5).to(device)
        if step == 2:
            x[0, 0] = float("inf")  # a step the scaler skips
        before = lazytpu.metrics.snapshot()["programs_compiled"]
        scaler.scale(model(x).square().sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        schedule.step()
        lazytpu.sync() if device == "tpu" else None
        compiled.append(lazytpu.metrics.snapshot()["programs_compiled"] - before)
    return [p.detach().cpu() for p in model.parameters()], scaler.get_scale(), compiled


@pytest.mark.parametrize(
    "cls, options",
    [
        (torch.optim.AdamW, dict(weight_decay=0.1)),
        (torch.optim.Adam, dict(amsgrad=True)),
        (torch.optim.SGD, dict(momentum=0.9, nesterov=True)),
        (torch.optim.Adagrad, dict(lr_decay=0.01)),
    ],
    ids=["AdamW", "Adam_amsgrad", "SGD_nesterov", "Adagrad"],
)
def test_fused_optimizer_trains_as_on_cpu_without_fallback_or_recompiles(cls, options):
    expected, expected_scale, _ = _train("cpu", cls, **options)
    with no_fallback():
        got, scale, compiled = _train("tpu", cls, **options)
    assert scale == expected_scale
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    assert compiled[-1] == 0, compiled  # the learning rate changed at every step


def test_fused_adamw_records_one_node_for_all_parameters():
    params = [torch.nn.Parameter(torch.randn(4, 3, device="tpu")) for _ in range(6)]
    for p in params:
        p.grad = torch.ones_like(p)
    opt = torch.optim.AdamW(params, fused=True)
    opt.step()
    lazytpu.sync()
    before = lazytpu.metrics.snapshot()["ops_recorded"]
    opt.step()
    # the steps' increment (one foreach node) and the fused step
    assert lazytpu.metrics.snapshot()["ops_recorded"] - before <= 3
