"""A failed op fails only the values that depend on it (Note [Failure isolation]).

Every other pending value is computed and keeps its result, pending in-place
updates of materialized tensors (parameters, optimizer state) included, and
the next steps run as before.
"""

from __future__ import annotations

import re
import sys

import pytest
import torch

import lazytpu
from lazytpu import _config, engine
from lazytpu.lowering import registry


@pytest.fixture
def failing_exp(monkeypatch):
    """Make the lowering of aten.exp fail when traced (an injected bug)."""

    def broken(x):
        raise ValueError("injected lowering failure")

    monkeypatch.setitem(registry.RULES.entries, torch.ops.aten.exp.default, registry.Rule(broken))
    lazytpu.runtime.clear_caches()  # an exp program compiled by an earlier test would not be lowered again


@pytest.fixture
def failing_xla(monkeypatch):
    """Make XLA fail to compile or run any program holding aten.exp: the failing op is not known."""
    execute = engine.runtime.execute

    def flaky(key, *args, **kwargs):
        if "aten.exp" in repr(key):
            raise RuntimeError("INTERNAL: injected XLA failure")
        return execute(key, *args, **kwargs)

    monkeypatch.setattr(engine.runtime, "execute", flaky)


@pytest.mark.parametrize("failure", ["failing_exp", "failing_xla"])
def test_a_failed_op_loses_no_other_tensor(failure, request):
    request.getfixturevalue(failure)
    with _config.DEBUG.override(frozenset()):
        a = torch.randn(3)
        w = torch.randn(3)
        at, wt = a.to("tpu"), w.to("tpu")
        wt.cpu()  # materialized, like a parameter
        wt.mul_(3)  # a pending in-place update of it
        b = at + 1  # unrelated pending work
        line = sys._getframe().f_lineno + 1
        bad = torch.ones(3).to("tpu").exp()
        tainted = bad + b  # depends on the failure
        with pytest.raises(RuntimeError, match="injected"):
            b.cpu()  # the sync raises the failure once, at the next host read ...
        assert b.cpu().equal(a + 1)  # ... and computed everything else
        assert wt.cpu().equal(w * 3)
        assert (wt + 1).cpu().equal(w * 3 + 1)
        for t in (bad, tainted):  # what depends on the failure keeps its error
            with pytest.raises(RuntimeError, match="injected") as info:
                t.cpu()
            if failure == "failing_exp":
                assert re.search(rf"aten\.exp\.default.*{re.escape(__file__)}:{line}\b", str(info.value))


def test_training_continues_after_an_unrelated_failure(failing_exp):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    model.to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    xt, yt = x.to("tpu"), y.to("tpu")

    def step(m, o, xs, ys):
        o.zero_grad()
        loss = torch.nn.functional.mse_loss(m(xs), ys)
        loss.backward()
        o.step()
        return loss

    for i in range(3):
        expected = step(reference, ref_opt, x, y)
        bad = torch.ones(6).to("tpu").exp() if i == 1 else None  # pending with the step's update
        loss = step(model, opt, xt, yt)
        if bad is None:
            assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        else:
            with pytest.raises(RuntimeError, match="injected"):
                loss.item()
            assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach())


def test_a_failed_deferred_check_fails_only_its_dependents():
    singular = torch.zeros(3, 3)
    singular[0, 0] = 1
    with pytest.raises(torch.linalg.LinAlgError) as expected:
        torch.linalg.inv(singular)
    x = torch.arange(4.0).to("tpu")
    line = sys._getframe().f_lineno + 1
    inverse = torch.linalg.inv(singular.to("tpu"))
    total = inverse.sum() + 1  # depends on the checked op
    doubled = x * 2  # does not
    with pytest.raises(torch.linalg.LinAlgError) as first:
        doubled.cpu()
    message = f"{expected.value} (torch.linalg.inv recorded at {__file__}:{line})"
    assert str(first.value) == message
    assert doubled.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    for t in (inverse, total):
        with pytest.raises(RuntimeError, match=re.escape(message)):
            t.cpu()


def test_a_value_read_after_a_failure_is_still_failed_in_a_later_program(failing_exp):
    bad = torch.ones(9).to("tpu").exp()
    with pytest.raises(RuntimeError, match="injected"):
        bad.cpu()
    good = torch.arange(3.0).to("tpu") + 1
    with pytest.raises(RuntimeError, match="injected"):
        (bad * 2).sum().cpu()  # an op on the failed value fails with its error
    assert good.cpu().tolist() == [1.0, 2.0, 3.0]


def test_a_failure_is_raised_once_though_later_programs_carry_it(failing_exp):
    """A backward recorded from a failed value (its gradient still pending after the read that raised the
    failure) fails in a later program with the same error; that program's unrelated read does not
    raise the failure again."""
    x = torch.randn(4, 5).to("tpu").requires_grad_()
    out = x.exp() * 2
    out.backward(torch.ones_like(out))
    with pytest.raises(RuntimeError, match="injected"):
        out.detach().cpu()
    y = torch.arange(3.0).to("tpu").requires_grad_()
    (y * 3).sum().backward()
    assert y.grad.cpu().tolist() == [3.0, 3.0, 3.0]
    with pytest.raises(RuntimeError, match="injected"):
        x.grad.cpu()  # the value that depends on the failure still holds it


def test_a_program_that_fails_as_it_runs_spares_what_follows():
    """(Note [Failed buffers] in lazytpu.runtime.transfer) XLA allocates a program's
    buffers as it runs: 64 TiB fail after the launch returned. Every later host read
    raised the same error (a value check's probe computed there), and every later
    random op too (the device's key, or a generator's, computed there); ``synchronize`` and
    a read of a tensor computed there raised JAX's error."""
    torch.manual_seed(5)
    gen = torch.Generator(device="tpu").manual_seed(7)
    huge = torch.rand(2**22, 2**22, device="tpu")
    drawn = torch.rand(2**22, 2**22, device="tpu", generator=gen)  # the generator's key computed there too
    picked = torch.arange(4.0, device="tpu")[torch.tensor([1, 2], device="tpu")]  # a value check in that program
    with pytest.raises(torch.OutOfMemoryError, match="out of device memory"):
        torch.tpu.synchronize()
    with pytest.raises(torch.OutOfMemoryError, match="out of device memory"):  # torch's error, not JAX's
        huge[0, :2].cpu()
    del huge, drawn, picked
    with pytest.warns(UserWarning, match="random state was lost with a failed program; re-seeded"):
        after = torch.rand(3, device="tpu")
    torch.manual_seed(5)
    assert torch.equal(after.cpu(), torch.rand(3, device="tpu").cpu())  # the device's seed's first draws
    from_gen = torch.rand(3, device="tpu", generator=gen).cpu()
    assert torch.equal(from_gen, torch.rand(3, device="tpu", generator=gen.manual_seed(7)).cpu())  # its seed's
    assert (torch.ones(3, device="tpu") + 1).cpu().tolist() == [2.0, 2.0, 2.0]
    torch.tpu.synchronize()
