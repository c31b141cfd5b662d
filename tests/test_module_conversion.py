"""``Module.to("tpu")`` and back keep the module's Parameter objects, as CPU↔CUDA does
(Note [Module conversion]): tied weights stay tied, optimizers built before the move
keep working, ``requires_grad``, ``.grad``, hooks and Python attributes survive."""

from __future__ import annotations

import copy
import io
import weakref

import pytest
import torch
import torch.nn as nn
from conftest import tolerance

from lazytpu.frontend.tensor import REPRESENTATION, LazyTensor


class Tied(nn.Module):
    """Two layers sharing one weight (``b.weight = a.weight``), a frozen bias, and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.b.bias.requires_grad_(False)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))) * self.scale


def _x() -> torch.Tensor:
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(1))


def _named(model: nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters(remove_duplicate=False))


# (conversion, device type and dtype it leaves, the same conversion on CPU for the values)
CONVERSIONS = {
    "to_tpu": (lambda m: m.to("tpu"), "tpu", torch.float32, lambda m: m),
    "tpu_then_cpu": (lambda m: m.to("tpu").to("cpu"), "cpu", torch.float32, lambda m: m),
    "tpu_then_double": (lambda m: m.to("tpu").double(), "tpu", torch.float64, lambda m: m.double()),
    "double_to_tpu": (lambda m: m.to("tpu", torch.float64), "tpu", torch.float64, lambda m: m.double()),
    "twice_to_tpu": (lambda m: m.to("tpu").to("tpu"), "tpu", torch.float32, lambda m: m),
}


@pytest.mark.parametrize("name", sorted(CONVERSIONS))
def test_conversion_keeps_parameters(name):
    convert, device, dtype, on_cpu = CONVERSIONS[name]
    model = Tied()
    reference = on_cpu(copy.deepcopy(model))
    before = _named(model)
    assert model.b.weight is model.a.weight
    assert convert(model) is model
    after = _named(model)
    assert after.keys() == before.keys()
    for key, param in after.items():
        assert param is before[key], key
        assert isinstance(param, nn.Parameter), key
        assert param.device.type == device and param.dtype == dtype, key
        assert (type(param) is LazyTensor) == (device == "tpu"), key
        assert param.requires_grad == (key != "b.bias"), key
        torch.testing.assert_close(param.detach().cpu(), _named(reference)[key].detach(), rtol=0, atol=0, msg=key)
    assert model.b.weight is model.a.weight
    assert all(b.device.type == device for b in model.buffers())
    out = model(_x().to(device, dtype))
    torch.testing.assert_close(out.cpu(), reference(_x().to(dtype)), **tolerance(dtype))


def test_back_to_cpu_leaves_plain_parameters():
    model = Tied().to("tpu").cpu()
    for param in model.parameters():
        assert type(param) is nn.Parameter
        assert not set(vars(param)) & {*REPRESENTATION, "_is_param"}


def _train(model: nn.Module, device: str, steps: int = 3):
    """Losses, final parameters and gradients of Adam steps; the optimizer is built before the move."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.to(device)
    x = _x().to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.detach().cpu())
    params = {k: p.detach().cpu() for k, p in _named(model).items()}
    grads = {k: p.grad.cpu() for k, p in _named(model).items() if p.grad is not None}
    return torch.stack(losses), params, grads


def test_optimizer_built_before_move_trains_tied_weights_as_cpu():
    cpu_losses, cpu_params, cpu_grads = _train(Tied(), "cpu")
    model = Tied()
    tpu_losses, tpu_params, tpu_grads = _train(model, "tpu")
    assert model.b.weight is model.a.weight
    torch.testing.assert_close(tpu_losses, cpu_losses, **tolerance(torch.float32))
    assert tpu_grads.keys() == cpu_grads.keys() and "b.bias" not in tpu_grads
    for key in cpu_params:
        torch.testing.assert_close(tpu_params[key], cpu_params[key], **tolerance(torch.float32), msg=key)
    for key in cpu_grads:
        torch.testing.assert_close(tpu_grads[key], cpu_grads[key], **tolerance(torch.float32), msg=key)


def _with_hooks(model: nn.Module) -> list:
    """Mark ``a.weight`` as Hugging Face does; give it a gradient, a doubling hook and a post-accumulate hook."""
    calls = []
    weight = model.a.weight
    weight._is_hf_initialized = True
    weight.grad = torch.full_like(weight, 0.5)
    weight.register_hook(lambda g: g * 2)
    weight.register_post_accumulate_grad_hook(lambda p: calls.append(p.device.type))
    return calls


@pytest.mark.parametrize("there_and_back", [False, True])
def test_attributes_grad_and_hooks_survive(there_and_back):
    reference = Tied()
    cpu_calls = _with_hooks(reference)
    reference(_x()).sum().backward()
    model = Tied()
    calls = _with_hooks(model)
    weight = model.a.weight
    model.to("tpu")
    device = "tpu"
    if there_and_back:
        model.to("cpu")
        device = "cpu"
    assert weight is model.a.weight
    assert weight._is_hf_initialized is True
    assert weight.grad.device.type == device
    assert torch.equal(weight.grad.cpu(), torch.full((4, 4), 0.5))
    model(_x().to(device)).sum().backward()
    assert calls == [device] and cpu_calls == ["cpu"]
    torch.testing.assert_close(weight.grad.cpu(), reference.a.weight.grad, **tolerance(torch.float32))


def test_setting_data_rebinds_the_value():
    """``t.data = u`` makes ``t`` share ``u``'s storage, shape and dtype (what ``.half()`` of a tpu model relies on)."""
    results = {}
    for device in ("cpu", "tpu"):
        t = torch.zeros(2, device=device)
        u = torch.arange(6, dtype=torch.float64, device=device).reshape(2, 3)[:, 1:]
        t.data = u
        t.add_(1)
        results[device] = (t.cpu(), u.cpu(), t.shape, t.dtype)
    cpu, tpu = results["cpu"], results["tpu"]
    assert tpu[2:] == cpu[2:]
    torch.testing.assert_close(tpu[0], cpu[0], rtol=0, atol=0)
    torch.testing.assert_close(tpu[1], cpu[1], rtol=0, atol=0)


def test_weakly_referenced_parameter_still_converts():
    """``swap_tensors`` refuses a Parameter with a weak reference: the module then gets a new one, as before."""
    model = Tied()
    ref = weakref.ref(model.a.bias)
    reference = copy.deepcopy(model)
    model.to("tpu")
    assert model.a.bias.device.type == "tpu" and ref() is not model.a.bias
    torch.testing.assert_close(model(_x().to("tpu")).cpu(), reference(_x()), **tolerance(torch.float32))


def test_tpu_tensors_carry_no_weak_references():
    """lazytpu keeps no weak reference to a tensor it makes (a copy, an op's result, a view, a
    Parameter moved by ``.to``): ``torch.utils.swap_tensors``, which module conversion relies on,
    refuses tensors that have one."""
    x = torch.randn(3, 4).to("tpu")
    made = [x, x * 2, x.t(), x[1:], x.detach(), torch.nn.Linear(4, 2).to("tpu").weight, torch.empty(2, device="tpu")]
    assert [weakref.getweakrefcount(t) for t in made] == [0] * len(made)
    a, b = x * 2, torch.zeros(5, device="tpu")
    torch.utils.swap_tensors(a, b)
    assert a.shape == (5,) and b.shape == (3, 4)
    torch.testing.assert_close(b.cpu(), x.cpu() * 2)


@pytest.mark.parametrize(
    "args, kwargs, requires_grad",
    [((), {}, True), ((False,), {}, False), ((), {"requires_grad": False}, False), ((True,), {}, True)],
)
def test_the_class_of_a_parameter_makes_a_parameter(args, kwargs, requires_grad):
    """``type(param)(data, requires_grad=...)``, as accelerate rebuilds a parameter it moves
    (``set_module_tensor_to_device``): a Parameter on CPU and CUDA; on tpu ``type(param)`` is the
    tensor type, whose constructor raised TypeError."""
    for device in ("cpu", "tpu"):
        param = nn.Linear(2, 3).to(device).weight
        data = torch.arange(6.0, device=device).reshape(3, 2)
        rebuilt = type(param)(data, *args, **kwargs)
        assert isinstance(rebuilt, nn.Parameter) and rebuilt.requires_grad is requires_grad
        assert rebuilt.device == data.device and torch.equal(rebuilt.detach().cpu(), data.cpu())


class Marked(nn.Parameter):
    """A library's parameter class: methods of its own."""

    def kind(self) -> str:
        return "marked"


class Tagged(nn.Parameter):
    """A library's parameter class that wraps its data in ``__new__`` (as bitsandbytes' do), with state."""

    def __new__(cls, data=None, requires_grad=True, tag=""):
        self = torch.Tensor._make_subclass(cls, data, requires_grad)
        self.tag = tag
        return self


def _subclassed() -> Tied:
    model = Tied()
    model.a.weight = model.b.weight = Marked(model.a.weight.detach().clone())
    model.a.bias = Tagged(model.a.bias.detach().clone(), tag="bias")
    return model


def test_parameter_subclasses_keep_their_class_on_tpu_and_back():
    """``model.to("tpu")`` made a Parameter of a user's subclass a plain tpu Parameter (its methods,
    ``isinstance`` and the class's state gone); ``P(t)`` of a tpu tensor too, and ``_make_subclass``
    raised. On CUDA they keep their class."""
    cpu_losses, cpu_params, _ = _train(_subclassed(), "cpu")
    model = _subclassed()
    weight, bias = model.a.weight, model.a.bias
    tpu_losses, tpu_params, _ = _train(model, "tpu")  # its optimizer built before the move
    assert model.a.weight is model.b.weight is weight and model.a.bias is bias
    assert isinstance(weight, Marked) and weight.kind() == "marked" and weight.device.type == "tpu"
    assert isinstance(bias, Tagged) and bias.tag == "bias" and bias.requires_grad
    torch.testing.assert_close(tpu_losses, cpu_losses, **tolerance(torch.float32))
    for key in cpu_params:
        torch.testing.assert_close(tpu_params[key], cpu_params[key], **tolerance(torch.float32), msg=key)
    copied = copy.deepcopy(model)
    assert type(copied.a.weight) is type(weight) and copied.a.weight is copied.b.weight
    assert repr(bias).startswith("Parameter containing:\nParameter(Tagged([") and "device='tpu:0'" in repr(bias)
    model.to("cpu")
    assert type(weight) is Marked and type(bias) is Tagged and bias.tag == "bias"
    made = Marked(torch.ones(2, device="tpu"), requires_grad=False)
    assert isinstance(made, Marked) and isinstance(made, nn.Parameter) and not made.requires_grad


def test_parameter_subclasses_save_as_on_cpu():
    """torch rebuilds a saved Parameter of a subclass as a ``Parameter`` with its attributes."""
    model = _subclassed().to("tpu")
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded.a.bias) is LazyTensor and isinstance(loaded.a.bias, nn.Parameter)
    assert loaded.a.bias.tag == "bias" and torch.equal(loaded.a.bias.cpu(), model.a.bias.cpu())
