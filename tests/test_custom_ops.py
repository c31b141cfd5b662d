"""A user's own ``torch.library`` ops on ``tpu``: the kernel torch would pick
for the device runs, as on CPU and CUDA (Note [Resolution order], step 6)."""

import warnings

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import lazytpu


@torch.library.custom_op("lazytpu_custom_test::sin_twice", mutates_args=())
def _sin_twice(x: torch.Tensor) -> torch.Tensor:
    return torch.sin(x) * 2


@_sin_twice.register_fake
def _(x):
    return torch.empty_like(x)


_sin_twice.register_autograd(
    lambda ctx, grad: grad * 2 * ctx.saved_tensors[0].cos(),
    setup_context=lambda ctx, inputs, output: ctx.save_for_backward(inputs[0]),
)


@torch.library.custom_op("lazytpu_custom_test::plus_one", mutates_args=())
def _plus_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@_plus_one.register_kernel("tpu")
def _(x):
    return x + 100


@torch.library.custom_op("lazytpu_custom_test::numpy_sin", mutates_args=(), device_types="cpu")
def _numpy_sin(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(np.sin(x.numpy()))


@_numpy_sin.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("lazytpu_custom_test::numpy_add_", mutates_args=("x",), device_types="cpu")
def _numpy_add_(x: torch.Tensor, y: torch.Tensor) -> None:
    np.add(x.numpy(), y.numpy(), out=x.numpy())


_LIB = torch.library.Library("lazytpu_custom_test", "DEF")
_LIB.define("times_seven(Tensor x) -> Tensor")
_LIB.impl("times_seven", lambda x: x * 7, "CompositeExplicitAutograd")


def _fallbacks():
    return lazytpu.metrics.snapshot()["cpu_fallbacks"]


def test_a_custom_ops_body_runs_on_the_device_with_its_autograd():
    x = torch.randn(5, requires_grad=True)
    xt = x.detach().to("tpu").requires_grad_()
    lazytpu.metrics.reset()
    out = _sin_twice(xt)
    out.sum().backward()
    _sin_twice(x).sum().backward()
    assert _fallbacks() == {}
    assert_close(out.cpu(), _sin_twice(x.detach()))
    assert_close(xt.grad.cpu(), x.grad)


def test_a_kernel_registered_for_tpu_runs_instead_of_the_body():
    x = torch.arange(3.0)
    assert_close(_plus_one(x), x + 1)
    assert_close(_plus_one(x.to("tpu")).cpu(), x + 100)


def test_a_kernel_for_every_device_runs_on_the_device():
    x = torch.arange(3.0)
    lazytpu.metrics.reset()
    out = torch.ops.lazytpu_custom_test.times_seven(x.to("tpu"))
    assert _fallbacks() == {}
    assert_close(out.cpu(), x * 7)


def test_a_custom_op_for_cpu_only_runs_its_cpu_kernel():
    # A NumPy body: torch runs it for CPU tensors only; on tpu it runs on CPU
    # (counted and warned as any op without a lowering), and its mutation of a
    # view lands in the tpu base.
    x = torch.randn(4)
    base = torch.zeros(3, device="tpu")
    lazytpu.metrics.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = _numpy_sin(x.to("tpu"))
        _numpy_add_(base[1:], torch.ones(2, device="tpu"))
    assert out.device.type == "tpu"
    assert_close(out.cpu(), torch.sin(x))
    assert_close(base.cpu(), torch.tensor([0.0, 1.0, 1.0]))
    assert set(_fallbacks()) == {"lazytpu_custom_test.numpy_sin.default", "lazytpu_custom_test.numpy_add_.default"}


@torch.library.custom_op("lazytpu_custom_test::cuda_only", mutates_args=(), device_types="cuda")
def _cuda_only(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def test_a_custom_op_for_other_devices_only_raises_as_on_cpu():
    with pytest.raises(NotImplementedError, match="lazytpu_custom_test::cuda_only"):
        _cuda_only(torch.zeros(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NotImplementedError, match="lazytpu_custom_test::cuda_only"):
            _cuda_only(torch.zeros(2, device="tpu"))
