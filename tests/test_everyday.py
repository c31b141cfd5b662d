"""Everyday torch on tpu, each against CPU torch: ``copy.deepcopy``, storages,
``torch.load(map_location=...)``, lazy modules, ``DataLoader`` pinning and workers."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

DEVICES = ("cpu", "tpu")


def _views(device: str) -> dict:
    """A base, two views of it, a pending value and a leaf with a gradient."""
    base = torch.arange(12.0, device=device)
    leaf = torch.linspace(-1, 1, 4, device=device).requires_grad_()
    (leaf * leaf).sum().backward()
    return {"base": base, "part": base[2:6], "grid": base.view(3, 4), "pending": base * 2, "leaf": leaf}


def _host(x):
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


# -- copy.deepcopy -----------------------------------------------------------------


def test_deepcopy_keeps_values_views_and_identity():
    results = {}
    for device in DEVICES:
        original = _views(device)
        pair = [original["part"], original["part"]]
        copied, copied_pair = copy.deepcopy((original, pair))
        assert copied_pair[0] is copied_pair[1]
        assert copied["leaf"].requires_grad and copied["leaf"].is_leaf
        grad = copied["leaf"].grad
        copied["part"][0] = 100.0  # the copy's views share the copy's base, not the original's
        copied["grid"][2, 3] = -5.0
        results[device] = (
            {k: _host(v) for k, v in copied.items()},
            {k: _host(v) for k, v in original.items()},
            _host(grad),
        )
    assert results["tpu"][2] is not None
    for tpu, cpu in zip(results["tpu"], results["cpu"]):
        torch.testing.assert_close(tpu, cpu, rtol=0, atol=0)


def test_deepcopy_of_a_pending_value_leaves_the_original_alone():
    with torch.tpu.set_eager_mode("defer"):
        x = torch.arange(6.0, device="tpu").reshape(2, 3) * 3  # still pending
        y = copy.deepcopy(x)
        y.add_(1)
        x.mul_(2)
        assert torch.equal(y.cpu(), torch.arange(6.0).reshape(2, 3) * 3 + 1)
        assert torch.equal(x.cpu(), torch.arange(6.0).reshape(2, 3) * 6)


def _tied_model(device: str) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5)).to(device)
    model[1].weight = model[0].weight
    return model


def test_deepcopy_of_a_module_as_on_cpu():
    """Parameters stay Parameters (``Parameter.__deepcopy__``: cloned data, its
    ``requires_grad``, no ``.grad``), tied ones stay tied, and training the copy
    leaves the original as it was."""
    seen = {}
    for device in DEVICES:
        model = _tied_model(device)
        model[1].bias.requires_grad_(False)
        ids = torch.tensor([0, 3, 4], device=device)
        model(ids).sum().backward()
        twin = copy.deepcopy(model)
        assert twin[1].weight is twin[0].weight
        assert all(isinstance(p, nn.Parameter) for p in twin.parameters())
        assert [p.requires_grad for p in twin.parameters()] == [p.requires_grad for p in model.parameters()]
        assert [p.grad is None for p in twin.parameters()] == [True, True]
        before = {k: _host(v) for k, v in model.state_dict().items()}
        opt = torch.optim.SGD(twin.parameters(), lr=0.5)
        twin(ids).sum().backward()
        opt.step()
        assert all(torch.equal(_host(v), before[k]) for k, v in model.state_dict().items())
        seen[device] = (_host(twin(ids)), _host(model(ids)))
    for tpu, cpu in zip(seen["tpu"], seen["cpu"]):
        torch.testing.assert_close(tpu, cpu)


def test_deepcopy_of_a_non_leaf_raises_torchs_error():
    for device in DEVICES:
        x = torch.ones(2, device=device, requires_grad=True) * 2
        with pytest.raises(RuntimeError, match="Only Tensors created explicitly by the user"):
            copy.deepcopy(x)


# -- storages -----------------------------------------------------------------------


def _storage_facts(t: torch.Tensor) -> tuple:
    untyped, typed = t.untyped_storage(), t.storage()
    return (untyped.nbytes(), untyped.size(), typed.size(), typed.element_size(), typed.dtype, t.storage_offset())


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
@pytest.mark.parametrize(
    "make",
    [
        lambda d: torch.arange(12.0, device=d),
        lambda d: torch.arange(12.0, device=d)[2:5],
        lambda d: torch.arange(24, device=d).view(4, 6)[1:, ::2],
        lambda d: torch.arange(12.0, device=d).view(torch.int16),
        lambda d: torch.arange(12.0, device=d).view(3, 4).t(),
        lambda d: torch.empty_strided((2, 3), (7, 8), device=d),
        lambda d: torch.zeros(0, 3, device=d),
        lambda d: torch.tensor(2.5, dtype=torch.float64, device=d),
    ],
    ids=["base", "slice", "strided_view", "dtype_view", "transpose", "gaps", "empty", "scalar"],
)
def test_storage_sizes_as_on_cpu(make):
    """A view reports its base's storage, as on CPU."""
    assert _storage_facts(make("tpu")) == _storage_facts(make("cpu"))
    assert make("tpu").untyped_storage().device.type == "tpu"


# -- lazy modules -----------------------------------------------------------------------

LAZY_MODULES = {
    "linear": (lambda: nn.LazyLinear(3), (4, 5)),
    "conv2d": (lambda: nn.LazyConv2d(4, 3), (2, 3, 6, 6)),
    "batchnorm1d": (lambda: nn.LazyBatchNorm1d(), (4, 5)),
}


@pytest.mark.parametrize("name", LAZY_MODULES)
def test_lazy_module_moved_before_its_first_forward(name):
    """As on CUDA: ``.to("tpu")`` keeps the parameters uninitialized (the same
    objects, now on tpu); the first forward materializes them there. With
    CPU's seed-initialized weights loaded, forward, backward and a step equal CPU's."""
    make, shape = LAZY_MODULES[name]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    reference = make()
    reference(x)  # initialized on CPU
    model = make()
    weight = model.weight
    model.to("tpu")
    assert model.weight is weight and nn.parameter.is_lazy(weight) and model.has_uninitialized_params()
    assert isinstance(weight, nn.parameter.UninitializedParameter) and weight.device.type == "tpu"
    assert all(b.device.type == "tpu" for b in model.buffers())
    with pytest.raises(RuntimeError, match="Can't access the shape of an uninitialized parameter"):
        _ = weight.shape
    model(x.to("tpu"))
    assert not any(nn.parameter.is_lazy(t) for t in (*model.parameters(), *model.buffers()))
    assert model.weight is weight and type(model) is type(reference)
    assert isinstance(weight, nn.Parameter) and not nn.parameter.is_lazy(weight)
    assert weight.device.type == "tpu" and weight.shape == reference.weight.shape
    assert [(k, v.shape, v.dtype) for k, v in model.state_dict().items()] == [
        (k, v.shape, v.dtype) for k, v in reference.state_dict().items()
    ]
    model.load_state_dict(reference.state_dict())
    outs = {}
    for device, m in (("cpu", reference), ("tpu", model)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        out = m(x.to(device))
        out.square().sum().backward()
        opt.step()
        outs[device] = (_host(out), {k: _host(v) for k, v in m.state_dict().items()})
    torch.testing.assert_close(outs["tpu"], outs["cpu"])


def test_lazy_module_round_trips_and_copies_uninitialized():
    model = nn.LazyLinear(3).to("tpu")
    twin = copy.deepcopy(model)
    assert nn.parameter.is_lazy(twin.weight) and twin.weight.device.type == "tpu"
    back = model.cpu()
    assert type(back.weight) is nn.parameter.UninitializedParameter and back.weight.device.type == "cpu"
    torch.manual_seed(0)
    source = nn.Linear(5, 3)
    twin.load_state_dict(source.state_dict())  # materializes on tpu, as on CUDA
    assert twin.weight.device.type == "tpu" and torch.equal(twin.weight.cpu(), source.weight.detach())
