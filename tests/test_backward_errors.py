"""Errors inside autograd's engine are raised by ``backward()``, as on CPU, never an abort.

Before Note [Errors in backward] (lazytpu/device/backward_errors.py), a tensor
or module hook that raised during a tpu backward (a NaN assertion, a
KeyboardInterrupt) aborted the process ("terminate called without an active
exception"), and a tpu op that failed in backward only warned: the pass went
on, and ``optimizer.step()`` then ran on failed gradients.
"""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.nn.functional as F

from lazytpu.frontend import tensor

DEVICES = ["cpu", "tpu"]


class Stop(Exception):
    pass


def _raise(error):
    raise error


def _leaf(device):
    return torch.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)


# name -> fn(device, error): a backward pass during which something raises ``error``
PASSES = {
    "tensor_hook": lambda d, e: _with_hook(_leaf(d) * 3, lambda g: _raise(e)).sum().backward(),
    "leaf_hook": lambda d, e: (_with_hook(_leaf(d), lambda g: _raise(e)) * 3).sum().backward(),
    "post_accumulate_grad_hook": lambda d, e: _post_accumulate(_leaf(d), e).sum().backward(),
    "module_full_backward_hook": lambda d, e: _module(d, e)(torch.ones(1, 2, device=d)).sum().backward(),
    "autograd_grad": lambda d, e: _grad(_leaf(d), e),
}


def _grad(leaf, error):
    return torch.autograd.grad(_with_hook(leaf * 3, lambda g: _raise(error)).sum(), [leaf])


def _with_hook(t, hook):
    t.register_hook(hook)
    return t


def _post_accumulate(leaf, error):
    leaf.register_post_accumulate_grad_hook(lambda p: _raise(error))
    return leaf * 3


def _module(device, error):
    module = torch.nn.Linear(2, 2).to(device)
    module.register_full_backward_hook(lambda *args: _raise(error))
    return module


@pytest.mark.parametrize("name", list(PASSES))
@pytest.mark.parametrize("error", [Stop("from a hook"), KeyboardInterrupt("interrupted")], ids=["error", "interrupt"])
@pytest.mark.parametrize("device", DEVICES)
def test_an_error_in_a_hook_is_raised_by_backward(name, error, device):
    with pytest.raises(type(error), match=str(error)) as raised:
        PASSES[name](device, error)
    assert "_raise" in "".join(traceback.format_tb(raised.value.__traceback__))  # the hook's own frame
    x = _leaf(device)
    (x * 2).sum().backward()  # and autograd goes on working
    assert x.grad.cpu().tolist() == [2.0, 2.0, 2.0]


def test_a_failed_op_in_backward_stops_the_pass_before_the_optimizer_runs():
    """CPU raises at ``backward()``; tpu warned, finished the pass with failed gradients,
    and the optimizer's step then wrote failed values into the parameters."""
    for device in DEVICES:
        weight = torch.nn.Parameter(torch.tensor([-1.0, 1.0], device=device))
        optimizer = torch.optim.SGD([weight], lr=0.1)
        loss = F.elu_(weight * 1.0, alpha=-2.0).sum()
        with pytest.raises(RuntimeError, match="negative slope"):
            loss.backward()
            optimizer.step()
        assert weight.detach().cpu().tolist() == [-1.0, 1.0]
        (weight * 2).sum().backward()  # the next step works
        optimizer.step()
        assert weight.detach().cpu().tolist() == pytest.approx([-1.2, 0.8])


def test_an_interrupt_inside_a_tpu_op_during_backward_is_raised_by_backward():
    """Ctrl-C lands in whatever Python runs: during a tpu backward, mostly lazytpu's dispatch."""

    def interrupted(func, args, kwargs):
        if func is torch.ops.aten.mul.Tensor and torch._C._current_graph_task_id() != -1:
            raise KeyboardInterrupt("interrupted")
        return dispatch(func, args, kwargs)

    x = _leaf("tpu")
    y = (x * x).sum()
    dispatch = tensor.install(dispatch=interrupted)["dispatch"]
    try:
        with pytest.raises(KeyboardInterrupt, match="interrupted"):
            y.backward()
    finally:
        tensor.install(dispatch=dispatch)
    (x * 2).sum().backward()
    assert x.grad.cpu().tolist() == [2.0, 2.0, 2.0]


class _Moved(torch.autograd.Function):
    """A backward that returns its gradient on another device (Note [Gradients of custom Functions])."""

    @staticmethod
    def forward(ctx, x, to):
        ctx.to = to
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.to), None


@pytest.mark.parametrize(("device", "to"), [("tpu", "cpu"), ("cpu", "tpu")])
def test_a_custom_functions_gradient_on_another_device_is_refused(device, to):
    """As CUDA's engine refuses it (a CPU ``.grad`` of a tpu leaf before); a 0-d one is moved, as torch moves it."""
    x = torch.ones(3, device=device, requires_grad=True)
    with pytest.raises(RuntimeError) as refused:
        _Moved.apply(x, to).sum().backward()
    assert str(refused.value) == (
        f"Function _MovedBackward returned an invalid gradient at index 0 - expected device "
        f"{torch.empty(0, device=device).device} but got {torch.empty(0, device=to).device}"
    )
    scalar = torch.tensor(1.0, device=device, requires_grad=True)
    _Moved.apply(scalar, to).backward()
    assert scalar.grad.device == scalar.device and scalar.grad.item() == 1.0
