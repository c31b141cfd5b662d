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


def _constructed(device):
    x = torch.tensor([1.0, 2.0, 3.0], device=device, requires_grad=True)
    called = Plain(x)  # torch.Tensor.__new__: a view that autograd tracks
    made = torch.Tensor._make_subclass(Plain, x, True)  # a detached leaf on x's data
    made_keyword = torch.Tensor._make_subclass(Plain, x.detach(), require_grad=False)
    autograd = (type(called.grad_fn).__name__, made.grad_fn, made.is_leaf, made.requires_grad)
    (called * made).sum().backward()
    with torch.no_grad():
        made.mul_(10)  # writes through to x, as _make_subclass shares its data (and its version)
    return {
        "types": (type(called).__name__, type(made).__name__, type(made_keyword).__name__),
        "autograd": (*autograd, x._version),
        "requires_grad": made_keyword.requires_grad,
        "values": (x.detach().cpu(), x.grad.cpu(), made.grad.cpu()),
    }


def test_a_subclass_constructed_from_a_tpu_tensor_behaves_as_on_cpu():
    """``cls(t)`` and ``torch.Tensor._make_subclass(cls, t, requires_grad)`` (how a class's
    ``__new__`` wraps a tensor) raised "already associated to a python object" on tpu."""
    cpu, tpu = _constructed("cpu"), _constructed("tpu")
    assert tpu["types"] == cpu["types"] == ("Plain", "Plain", "Plain")
    assert tpu["autograd"] == cpu["autograd"]
    assert tpu["requires_grad"] is cpu["requires_grad"] is False
    for got, want in zip(tpu["values"], cpu["values"]):
        assert_close(got, want)
    assert isinstance(Plain(torch.ones(1, device="tpu")), Plain)


class _Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.conv = torch.nn.Conv1d(4, 4, 3, padding=1)
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, tokens, signal):
        h = self.embed(tokens).sum(1) + torch.relu(self.conv(signal)).mean(2)
        return self.head(self.norm(h))


def test_per_sample_gradients_of_expanded_weights_as_on_cpu():
    """``call_for_per_sample_grads`` wraps each parameter in an ``ExpandedWeight`` made by
    ``torch.Tensor._make_subclass``, which raised on tpu."""
    from torch.nn.utils._per_sample_grad import call_for_per_sample_grads

    torch.manual_seed(0)
    tokens, signal = torch.randint(0, 10, (3, 5)), torch.randn(3, 4, 6)
    grads = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        model = _Small().to(device)
        call_for_per_sample_grads(model)(tokens.to(device), signal.to(device)).square().sum().backward()
        grads[device] = {name: p.grad_sample.cpu() for name, p in model.named_parameters()}
    assert grads["tpu"].keys() == grads["cpu"].keys() and grads["cpu"]["head.weight"].shape == (3, 2, 4)
    for name, want in grads["cpu"].items():
        assert_close(grads["tpu"][name], want, msg=name)
