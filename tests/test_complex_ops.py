"""Complex inputs of ops whose real-valued formulas differ: each is compared
with CPU torch (found by the complex64 cases of the full OpInfo sweep, which
the default run does not include)."""

from __future__ import annotations

import pytest
import torch

INF, NAN = float("inf"), float("nan")


def _z(*shape, seed=0, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.complex64, generator=gen) * scale


def _special():
    x = _z(4, 5)
    x[0, 0], x[1, 1], x[2, 2] = complex(INF, 1), complex(-INF, 0), complex(NAN, 0)
    x[3, :] = complex(-INF, 0)
    return x


CASES = {
    "angle": lambda x: torch.angle(x),
    "logaddexp": lambda x: torch.logaddexp(x, x.flip(0) * 0.5j),
    "logsumexp_dim": lambda x: torch.logsumexp(x, 1),
    "logsumexp_all_keepdim": lambda x: torch.logsumexp(x, (0, 1), keepdim=True),
    "logsumexp_0d": lambda x: torch.logsumexp(x[0, 3] * 500, 0),  # CPU wraps the angle even over no axis
    "logcumsumexp_0": lambda x: torch.logcumsumexp(x, 0),
    "logcumsumexp_1": lambda x: torch.logcumsumexp(x * 4, 1),
}


@pytest.mark.parametrize("input_", [_z(4, 5), _special()], ids=["finite", "special"])
@pytest.mark.parametrize("name", CASES)
def test_complex_forward_matches_cpu(name, input_):
    expected = CASES[name](input_)
    actual = CASES[name](input_.to("tpu")).cpu()
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, equal_nan=True, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "fn", [torch.tanh, torch.sigmoid, torch.nn.functional.tanhshrink], ids=["tanh", "sigmoid", "tanhshrink"]
)
def test_complex_gradients_are_conjugated_as_on_cpu(fn):
    cotangent = _z(6, seed=1)

    def grad(device):
        x = (_z(6) * 0.3).to(device).requires_grad_()
        fn(x).backward(cotangent.to(device))
        return x.grad.cpu()

    torch.testing.assert_close(grad("tpu"), grad("cpu"), rtol=1e-5, atol=1e-5)


def test_lstsq_residuals_of_complex_input_are_real():
    a, b = _z(6, 3), _z(6, 2, seed=1)
    expected = torch.linalg.lstsq(a, b, driver="gelsd")
    actual = torch.linalg.lstsq(a.to("tpu"), b.to("tpu"), driver="gelsd")
    assert [t.dtype for t in actual] == [t.dtype for t in expected]
    torch.testing.assert_close(actual.residuals.cpu(), expected.residuals)


@pytest.mark.parametrize("hermitian", [False, True], ids=["symmetric", "hermitian"])
@pytest.mark.parametrize("seed", range(3))
def test_complex_ldl_factor_and_solve_match_lapack(hermitian, seed):
    a = _z(6, 6, seed=seed).to(torch.complex128)
    a = a + (a.mH if hermitian else a.mT)
    if seed == 2:  # zero diagonal entries force 2x2 pivots
        a[0, 0] = a[2, 2] = a[3, 3] = 0
    b = _z(6, 2, seed=seed + 10).to(torch.complex128)
    ld, pivots = torch.linalg.ldl_factor(a, hermitian=hermitian)
    ld_t, pivots_t = torch.linalg.ldl_factor(a.to("tpu"), hermitian=hermitian)
    assert torch.equal(pivots_t.cpu(), pivots)
    torch.testing.assert_close(ld_t.cpu(), ld)
    x = torch.linalg.ldl_solve(ld_t, pivots_t, b.to("tpu"), hermitian=hermitian).cpu()
    torch.testing.assert_close(x, torch.linalg.ldl_solve(ld, pivots, b, hermitian=hermitian))
