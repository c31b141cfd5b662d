"""``make_fx`` and ``torch.func``'s transforms on ``tpu`` tensors give CPU's numbers
(Note [Traced as a tensor] in lazytpu.frontend.tensor)."""

from __future__ import annotations

import pytest
import torch
from torch.func import grad, jacrev, jvp, linearize, vmap
from torch.fx.experimental.proxy_tensor import make_fx

pytestmark = [
    pytest.mark.filterwarnings("ignore:Attempted to insert a get_attr Node"),  # torch's const_fold, on CPU too
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning"),  # torch.func's own
]


def _on(device):
    x = torch.tensor([0.5, 1.0, 2.0], device=device)
    return x, torch.tensor([1.0, 2.0, 3.0], device=device)


@pytest.mark.parametrize("device", ["cpu", "tpu"])
def test_make_fx_traces_ops_on_a_closed_over_tensor(device):
    # the graph returned a constant computed at trace time (lazytpu's meta work was traced instead)
    x, y = _on(device)
    graph = make_fx(lambda t: t * x.cos() + x.sum())(torch.zeros(3, device=device))
    assert "cos" in graph.code and "device(type='meta')" not in graph.code
    torch.testing.assert_close(graph(y).cpu(), (y * x.cos() + x.sum()).cpu())


def test_linearize_matches_jvp_and_cpu():
    results = []
    for device in ("cpu", "tpu"):
        x, t = _on(device)
        _, jvp_fn = linearize(lambda v: v.sin() * v, x)
        expected = jvp(lambda v: v.sin() * v, (x,), (t,))[1]
        torch.testing.assert_close(jvp_fn(t).cpu(), expected.cpu())
        results.append(jvp_fn(t).cpu())
    torch.testing.assert_close(results[1], results[0])


def test_vmap_grad_and_jacrev_match_cpu():
    def loss(w, x):
        return (x @ w).tanh().square().sum()

    w, xs = torch.randn(4, 3), torch.randn(5, 2, 4)
    expected = (vmap(grad(loss), in_dims=(None, 0))(w, xs), jacrev(lambda w: (xs[0] @ w).tanh())(w))
    got = (
        vmap(grad(loss), in_dims=(None, 0))(w.to("tpu"), xs.to("tpu")),
        jacrev(lambda w: (xs[0].to("tpu") @ w).tanh())(w.to("tpu")),
    )
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.cpu(), e)
