"""A user's tensor subclasses over tpu tensors, as over CPU ones: ``as_subclass``
(torchvision's ``tv_tensors`` wrap with it), their ``__torch_function__``, autograd
and aliasing (Note [Subclasses of tpu tensors])."""

import pytest
import torch
from torch.testing import assert_close


class Plain(torch.Tensor):
    """A subclass with torch's own ``__torch_function__``: its ops return ``Plain``."""


class Boxes(torch.Tensor):
    """As ``tv_tensors.BoundingBoxes``: metadata, ops unwrap except a few that keep the type."""

    @classmethod
    def wrap(cls, t, fmt):
        out = t.as_subclass(cls)
        out.fmt = fmt
        return out

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **(kwargs or {}))
        if func in (torch.Tensor.clone, torch.Tensor.to) and isinstance(out, torch.Tensor):
            return cls.wrap(out, args[0].fmt)
        return out


def _on(device):
    x = torch.tensor([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], device=device, requires_grad=True)
    y = x.as_subclass(Plain)
    grad_fn = type(y.grad_fn).__name__
    z = y * 2 + 1
    z.sum().backward()
    b = Boxes.wrap(x.detach(), "xyxy")
    moved = b.clone()
    unwrapped = b + 1
    alias = x.detach().as_subclass(Plain)
    alias.add_(10)  # writes through to x, as as_subclass aliases
    return {
        "types": (type(y).__name__, type(z).__name__, type(moved).__name__, type(unwrapped).__name__),
        "isinstance": (isinstance(y, Plain), isinstance(moved, Boxes), moved.fmt),
        "grad_fn": grad_fn,
        "values": (z.detach().as_subclass(torch.Tensor).cpu(), unwrapped.cpu(), x.detach().cpu(), x.grad.cpu()),
        "host": type(y.cpu()).__name__,
    }


def test_as_subclass_of_a_tpu_tensor_behaves_as_on_cpu():
    cpu, tpu = _on("cpu"), _on("tpu")
    for key in ("types", "isinstance", "grad_fn", "host"):
        assert tpu[key] == cpu[key], key
    for a, b in zip(tpu["values"], cpu["values"]):
        assert_close(a, b)
    x = torch.ones(2, device="tpu").as_subclass(Plain)
    assert x.device.type == "tpu" and x.as_subclass(torch.Tensor).device.type == "tpu"
    assert repr(x) == "Plain([1., 1.], device='tpu:0')"


def test_as_subclass_refuses_what_torch_refuses():
    with pytest.raises(TypeError, match="does not inherit from Tensor"):
        torch.ones(2, device="tpu").as_subclass(int)
