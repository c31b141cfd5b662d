"""``torch.distributions`` on ``tpu``: its samplers draw on the device (right
moments, CPU's edge cases and errors, reproducible under ``torch.manual_seed``)
and its reparameterized gradients are CPU torch's numbers; nothing falls back.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributions as D
from conftest import no_fallback

N = 20_000
TINY = torch.finfo(torch.float32).tiny


def full(value: float, n: int = N) -> torch.Tensor:
    return torch.full((n,), value, device="tpu")


# name -> (draw on tpu, low, high, mean, std)
SAMPLERS = {
    "gamma": (lambda: torch._standard_gamma(full(3.0)), TINY, None, 3.0, 3.0**0.5),
    "gamma_below_1": (lambda: torch._standard_gamma(full(0.5)), TINY, None, 0.5, 0.5**0.5),
    "poisson": (lambda: torch.poisson(full(4.0)), 0, None, 4.0, 2.0),
    "poisson_large": (lambda: torch.poisson(full(300.0)), 0, None, 300.0, 300.0**0.5),
    "binomial": (lambda: torch.binomial(full(10.0), full(0.3)), 0, 10, 3.0, 2.1**0.5),
    "binomial_above_half": (lambda: torch.binomial(full(100.0), full(0.9)), 0, 100, 90.0, 3.0),
    "dirichlet": (lambda: torch._sample_dirichlet(full(1.0).reshape(-1, 4) * 2)[:, 0], 0, 1, 0.25, (3 / 144) ** 0.5),
}


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_sampler_moments_on_the_device(name):
    draw, low, high, mean, std = SAMPLERS[name]
    torch.manual_seed(0)
    with no_fallback():
        values = draw().cpu().double()
    assert values.dtype == torch.float64 and values.min() >= low
    if high is not None:
        assert values.max() <= high
    assert abs(values.mean().item() - mean) < 0.05 * std
    assert abs(values.std().item() - std) < 0.05 * std


def test_samples_reproduce_under_manual_seed():
    def draw():
        alpha = torch.tensor([[0.5, 2.0, 7.0]], device="tpu")
        return torch.cat(
            [
                torch._standard_gamma(alpha)[0],
                torch._sample_dirichlet(alpha)[0],
                torch.poisson(alpha * 3)[0],
                torch.binomial(alpha[0] * 4, torch.tensor([0.2, 0.5, 0.7], device="tpu")),
            ]
        ).cpu()

    torch.manual_seed(7)
    first, second = draw(), draw()
    torch.manual_seed(7)
    assert torch.equal(draw(), first) and not torch.equal(first, second)


def test_cpus_edge_cases():
    """CPU's answers where the sampler has nothing to sample: Gamma draws are
    never below the smallest normal number (also of alpha <= 0 or NaN), a
    Dirichlet of equal tiny draws is uniform, no trials or p <= 0 draw 0, p >= 1 draws every trial."""
    with no_fallback():
        gamma = torch._standard_gamma(torch.tensor([0.0, -1.0, float("nan")], device="tpu"))
        dirichlet = torch._sample_dirichlet(torch.zeros(2, 3, device="tpu"))
        counts = torch.tensor([3.0, 0.0, 4.0, -2.0, 6.0], device="tpu")
        binomial = torch.binomial(counts, torch.tensor([1.0, 0.5, 0.0, 0.5, 2.0], device="tpu"))
        poisson = torch.poisson(torch.zeros(3, device="tpu"))
    assert torch.equal(gamma.cpu(), torch.full((3,), TINY))
    assert torch.equal(dirichlet.cpu(), torch.full((2, 3), 1 / 3))
    assert torch.equal(binomial.cpu(), torch.tensor([3.0, 0.0, 0.0, 0.0, 6.0]))
    assert torch.equal(poisson.cpu(), torch.zeros(3))


def test_torchs_errors():
    with pytest.raises(RuntimeError, match="invalid Poisson rate, expected rate to be non-negative"):
        torch.poisson(torch.tensor([1.0, -1.0], device="tpu")).cpu()
    with pytest.raises(RuntimeError, match="invalid Poisson rate"):
        torch.poisson(torch.tensor([float("nan")], device="tpu")).cpu()
    with pytest.raises(NotImplementedError, match="not implemented for 'Long'"):
        torch.poisson(torch.tensor([1, 2], device="tpu"))
    with pytest.raises(NotImplementedError, match="not implemented for 'BFloat16'"):
        torch._standard_gamma(torch.ones(2, device="tpu", dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="Found dtype Double but expected Float"):
        torch.binomial(torch.ones(2, device="tpu"), torch.ones(2, device="tpu", dtype=torch.float64))


def _gradient_inputs():
    """Gamma draws and Beta draws (with the mean, the saddle point's band),
    over the ranges where each of aten's approximations is used."""
    torch.manual_seed(0)
    n = 3000
    alpha = torch.cat([torch.rand(n) * 0.5 + 0.01, torch.rand(n) * 5, torch.rand(n) * 40 + 6])
    other = torch.cat([torch.rand(n) * 5, torch.rand(n) * 40 + 6, torch.rand(n) * 0.5 + 0.01]).roll(7)
    x = D.Beta(alpha, other).sample().clamp(1e-6, 1 - 1e-6)
    x[::11] = (alpha / (alpha + other))[::11]
    return alpha, _gamma_draws(alpha), x, alpha + other


def _gamma_draws(alpha):
    draws = torch._standard_gamma(alpha)
    draws[::7] = alpha[::7] * 1.05
    return draws


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reparameterized_gradients_are_cpus(dtype):
    """aten's approximations (Notes [Gamma's reparameterized gradient] and
    [Dirichlet's reparameterized gradient]): float64 to rounding, float32 as
    close as XLA's fused arithmetic allows (CPU's own float32 error against
    float64 is about 1e-3 here)."""
    alpha, draws, x, total = (t.to(dtype) for t in _gradient_inputs())
    with no_fallback():
        gamma = torch.ops.aten._standard_gamma_grad(alpha.to("tpu"), draws.to("tpu")).cpu()
        dirichlet = torch._dirichlet_grad(x.to("tpu"), alpha.to("tpu"), total.to("tpu")).cpu()
    expected_gamma = torch.ops.aten._standard_gamma_grad(alpha, draws)
    expected_dirichlet = torch._dirichlet_grad(x, alpha, total)
    rtol = 1e-11 if dtype == torch.float64 else 1e-3
    torch.testing.assert_close(gamma, expected_gamma, rtol=rtol, atol=0)
    torch.testing.assert_close(dirichlet, expected_dirichlet, rtol=rtol, atol=0)
    if dtype == torch.float32:  # most values are bit-equal, not merely close
        assert (gamma == expected_gamma).float().mean() > 0.9
        assert (dirichlet == expected_dirichlet).float().mean() > 0.5


def test_rsample_trains_on_the_device():
    """A reparameterized loss through Gamma, Beta, Dirichlet, Chi2 and StudentT
    draws backpropagates without leaving the device."""
    torch.manual_seed(0)
    concentration = torch.tensor([0.5, 2.0, 7.0], device="tpu", requires_grad=True)
    with no_fallback():
        samples = [
            D.Gamma(concentration, torch.ones(3, device="tpu")).rsample(),
            D.Beta(concentration, concentration.flip(0)).rsample(),
            D.Dirichlet(concentration).rsample(),
            D.Chi2(concentration).rsample(),
            D.StudentT(concentration).rsample(),
        ]
        sum(s.square().sum() for s in samples).backward()
        grad = concentration.grad.cpu()
        dirichlet = samples[2].detach().cpu()
    assert torch.isfinite(grad).all() and (grad != 0).all()
    assert abs(dirichlet.sum().item() - 1) < 1e-6 and (dirichlet > 0).all()
