"""A compiled graph's recompile is explained, and counted, once: by the
compile backend (``lazytpu.compile.explain``), not again by the engine for
the program that holds the graph."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from conftest import assert_close

import lazytpu
from lazytpu import _config


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    lazytpu.compile.clear()
    lazytpu.debug.clear()
    lazytpu.metrics.reset()
    yield
    torch._dynamo.reset()


def _double_then_sum(x):
    return (x * 2).sum(0)


def _reasons() -> dict:
    return dict(lazytpu.metrics.snapshot().get("recompile_reasons", {}))


def test_graph_recompile_counted_once(capsys):
    fn = torch.compile(_double_then_sum, backend="tpu", dynamic=False)
    a, b = torch.randn(3, 4), torch.randn(5, 4)
    assert_close(fn(a.to("tpu")).cpu(), _double_then_sum(a))
    assert _reasons() == {}
    with _config.DEBUG.override(frozenset({"recompile"})):
        assert_close(fn(b.to("tpu")).cpu(), _double_then_sum(b))
    assert _reasons() == {"guard failure / new input shapes": 1}
    assert len(lazytpu.debug.explain()) == 1
    assert len(lazytpu.compile.explain()) == 1
    err = capsys.readouterr().err
    assert err.count("lazytpu: compiling") == 1 and "float32[3, 4] -> float32[5, 4]" in err


def test_training_step_recompile_counted_once():
    # forward, backward and the optimizer in one program: a new batch size recompiles the
    # forward and backward graphs (each explained once) and nothing else is counted
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3).to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_of = torch.compile(lambda x: model(x).square().mean(), backend="tpu", dynamic=False)

    def step(n):
        opt.zero_grad()
        x = torch.randn(n, 4)
        loss = loss_of(x.to("tpu"))
        loss.backward()
        opt.step()
        return loss.item(), x

    for _ in range(3):
        step(2)
    lazytpu.metrics.reset()  # (the first steps' programs differ in eager ways: not this test's business)
    explained = len(lazytpu.debug.explain())
    cpu_model = torch.nn.Linear(4, 3)
    cpu_model.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    loss, x = step(6)
    assert loss == pytest.approx(cpu_model(x).square().mean().item(), rel=1e-5)
    reasons = _reasons()
    assert reasons == {"guard failure / new input shapes": 2}, reasons
    assert len(lazytpu.debug.explain()) - explained == 2  # the forward's and the backward's, nothing more
    assert len(lazytpu.compile.explain()) == 2


def test_eager_recompile_still_explained_by_the_engine():
    # the filter drops only what a compiled graph explained: an eager program's new shape is counted
    for n in (3, 5):
        (torch.randn(n, 4).to("tpu") * 2).sum().item()
    assert sum(_reasons().values()) == 1
