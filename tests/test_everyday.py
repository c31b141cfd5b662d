"""Everyday torch on tpu, each against CPU torch: ``copy.deepcopy``, storages,
``torch.load(map_location=...)``, lazy modules, ``DataLoader`` pinning and workers."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import mode

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


@pytest.mark.parametrize("name", LAZY_MODULES)
@pytest.mark.parametrize("how", ["device", "default_device"])
def test_lazy_module_made_on_tpu(name, how):
    """``nn.LazyLinear(3, device="tpu")`` (or tpu the default device) makes its
    uninitialized parameters on tpu (torch's class cannot hold a tpu tensor: it
    raised); the first forward materializes them there, with CPU's numbers."""
    make, shape = LAZY_MODULES[name]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    reference = make()
    reference(x)
    if how == "device":
        model = type(make())(*_lazy_args(make()), device="tpu")
    else:
        with torch.device("tpu"):
            model = make()
    assert model.has_uninitialized_params() and isinstance(model.weight, nn.parameter.UninitializedParameter)
    assert model.weight.device.type == "tpu" and all(b.device.type == "tpu" for b in model.buffers())
    model(x.to("tpu"))
    assert not any(nn.parameter.is_lazy(t) for t in model.parameters()) and isinstance(model.weight, nn.Parameter)
    model.load_state_dict(reference.state_dict())
    torch.testing.assert_close(_host(model(x.to("tpu"))), reference(x).detach())
    assert type(nn.parameter.UninitializedParameter(device="cpu")) is nn.parameter.UninitializedParameter


def _lazy_args(module) -> tuple:
    """The positional arguments a lazy module was made with (as in ``LAZY_MODULES``)."""
    if isinstance(module, nn.LazyLinear):
        return (module.out_features,)
    if isinstance(module, nn.LazyConv2d):
        return (module.out_channels, module.kernel_size)
    return ()


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


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_storage_values_read_through_a_storage():
    """Reading a tpu storage's elements copies them to the host, as they are on CPU."""
    seen = {}
    for device in DEVICES:
        x = torch.arange(6.0, device=device)
        view = x[2:4]
        memory = torch.empty(0, device=device).set_(view.untyped_storage(), 1, (2, 2), (1, 2))
        x[1] = 7.0  # seen through the storage, as a write to any view is
        typed = view.storage()
        seen[device] = (typed.tolist(), typed[3], view.untyped_storage()[4], _host(memory).tolist())
    assert seen["tpu"] == seen["cpu"]


def test_a_new_tpu_storage_takes_host_bytes():
    """``torch.UntypedStorage(n, device="tpu")`` (which crashed the process) and
    ``storage.copy_``; tensors set to it are windows on one upload."""
    values = torch.arange(4.0)
    memory = torch.UntypedStorage(values.nbytes, device="tpu")
    assert memory.device.type == "tpu" and memory.nbytes() == 16
    memory.copy_(values.untyped_storage())
    a = torch.empty(0, device="tpu").set_(memory, 0, (4,), (1,))
    b = torch.empty(0, device="tpu").set_(memory, 2, (2,), (1,))
    b.add_(10)
    assert a.tolist() == [0.0, 1.0, 12.0, 13.0]
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 16"):
        torch.empty(0, device="tpu").set_(memory, 3, (2,), (1,))


# -- torch.load(map_location=...) ---------------------------------------------------------


def _checkpoint(device: str) -> dict:
    """A state dict and a whole tensor with views sharing its storage, of several dtypes."""
    torch.manual_seed(0)
    base = torch.arange(12.0, device=device)
    return {
        "state": nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).to(device).state_dict(),
        "base": base,
        "part": base[2:6],
        "grid": base.view(3, 4).t(),
        "mask": torch.tensor([True, False, True], device=device),
        "half": torch.linspace(0, 1, 5, dtype=torch.bfloat16, device=device),
        "ids": torch.tensor([[3, -1]], dtype=torch.int64, device=device),
        "empty": torch.zeros(2, 0, device=device),  # no bytes: the legacy loader failed on it
    }


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): tree}


TO_TPU = {
    "tpu": "tpu",
    "tpu:0": "tpu:0",
    "device": torch.device("tpu"),
    "dict": {"cpu": "tpu"},
    "callable": lambda storage, location: storage.tpu(),
    "callable_index": lambda storage, location: storage.tpu(0),
}


def _params(table: dict) -> list:
    return [pytest.param(v, id=k) for k, v in table.items()]


def _assert_loaded_as(loaded: dict, expected: dict, device: str) -> None:
    """Same keys, dtypes and values, on ``device``, and the views still views:
    a write through one shows in the others, as on CPU."""
    got, want = _flat(loaded), _flat(expected)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key].device.type == device, key
        assert got[key].dtype == value.dtype, key
        assert torch.equal(_host(got[key]), _host(value)), key
    assert got["base"].untyped_storage().nbytes() == got["part"].untyped_storage().nbytes() == 48
    got["part"][1] = -1.0
    assert got["base"][3].item() == got["grid"][3, 0].item() == -1.0


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("map_location", _params(TO_TPU))
def test_load_a_cpu_checkpoint_onto_tpu(tmp_path, map_location, weights_only):
    path = tmp_path / "cpu.pt"
    torch.save(_checkpoint("cpu"), path)
    loaded = torch.load(path, map_location=map_location, weights_only=weights_only)
    _assert_loaded_as(loaded, _checkpoint("cpu"), "tpu")


FROM_TPU = {
    "none": (None, "tpu"),
    "cpu": ("cpu", "cpu"),
    "cpu_device": (torch.device("cpu"), "cpu"),
    "tpu": ("tpu", "tpu"),
    "dict_to_cpu": ({"tpu:0": "cpu"}, "cpu"),
    "callable_keep": (lambda storage, location: storage, "cpu"),
    "callable_tpu": (lambda storage, location: storage.tpu(), "tpu"),
}


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize(
    "map_location,device",
    [pytest.param(*v, id=k) for k, v in FROM_TPU.items()],
)
def test_load_a_tpu_checkpoint(tmp_path, map_location, device, weights_only):
    """A tpu checkpoint is saved as a CUDA one: its storages tagged tpu:0,
    loaded where ``map_location`` says (``lambda s, l: s`` keeps them on the host, as for CUDA)."""
    saved = _checkpoint("tpu")
    saved["part"], saved["grid"] = saved["base"][2:6], saved["base"].view(3, 4).t()
    path = tmp_path / "tpu.pt"
    torch.save(saved, path)
    loaded = torch.load(path, map_location=map_location, weights_only=weights_only)
    _assert_loaded_as(loaded, _checkpoint("cpu"), device)


@pytest.mark.parametrize(
    "map_location,device",
    [
        pytest.param(None, None, id="none"),
        pytest.param("cpu", "cpu", id="cpu"),
        pytest.param("tpu", "tpu", id="tpu"),
        pytest.param(lambda storage, location: storage.tpu(), "tpu", id="callable"),
    ],
)
@pytest.mark.parametrize("source", DEVICES)
def test_load_a_checkpoint_in_torchs_legacy_format(tmp_path, source, map_location, device):
    """``_use_new_zipfile_serialization=False``: the loader sets each tensor to
    its storage before it reads the bytes into that storage."""
    saved = _checkpoint(source)
    saved["part"], saved["grid"] = saved["base"][2:6], saved["base"].view(3, 4).t()
    path = tmp_path / "legacy.pt"
    torch.save(saved, path, _use_new_zipfile_serialization=False)
    loaded = torch.load(path, map_location=map_location, weights_only=False)
    _assert_loaded_as(loaded, _checkpoint("cpu"), device or source)


def test_storage_to_device_enters_the_device_module(tmp_path):
    """``lambda s, l: s.to(device="tpu")`` goes through torch's ``_to``, which
    enters ``torch.tpu.device``."""
    path = tmp_path / "cpu.pt"
    torch.save(_checkpoint("cpu"), path)
    loaded = torch.load(path, map_location=lambda storage, location: storage.to(device="tpu:0"))
    _assert_loaded_as(loaded, _checkpoint("cpu"), "tpu")


def test_load_of_the_earlier_tpu_format(tmp_path):
    """Files saved before tpu tensors were saved as CUDA ones still load, sharing."""

    class Earlier:
        def __init__(self, host):
            self.host = host

        def __reduce_ex__(self, protocol):
            return torch._utils._rebuild_device_tensor_from_cpu_tensor, (self.host, self.host.dtype, "tpu:0", False)

    base = torch.arange(12.0)
    base.untyped_storage()._lazytpu_location = "tpu:0"
    path = tmp_path / "earlier.pt"
    torch.save({"base": Earlier(base), "part": Earlier(base[2:6])}, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded["base"].device.type == "tpu" and torch.equal(loaded["base"].cpu(), base)
    loaded["part"][0] = 100.0
    assert loaded["base"][2].item() == 100.0


def test_map_location_to_a_missing_device_raises_torchs_error(tmp_path):
    path = tmp_path / "cpu.pt"
    torch.save(torch.ones(2), path)
    count = torch.tpu.device_count()
    with pytest.raises(RuntimeError, match=f"on TPU device {count} but torch.tpu.device_count\\(\\) is {count}"):
        torch.load(path, map_location=f"tpu:{count}")


def test_pickling_and_copying_keep_the_device():
    """``pickle`` and ``copy.copy`` as on CPU (pickled views do not share there
    either; ``copy.copy`` is an alias), on tpu."""
    import pickle

    seen = {}
    for device in DEVICES:
        x = torch.arange(6.0, device=device)
        whole, part = pickle.loads(pickle.dumps([x, x[1:3]]))
        assert whole.device.type == part.device.type == device
        part[0] = 50.0
        alias = copy.copy(x)
        alias[0] = -3.0
        assert alias.device.type == device
        seen[device] = [_host(t) for t in (x, whole, part, alias)]
    torch.testing.assert_close(seen["tpu"], seen["cpu"], rtol=0, atol=0)


# -- DataLoader ----------------------------------------------------------------------


def _train_from_loader(device: str, **loader_kwargs) -> list:
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in DataLoader(data, batch_size=8, **loader_kwargs):
        assert x.device.type == "cpu" and not x.is_pinned()
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x.to(device, non_blocking=True)), y.to(device, non_blocking=True))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses + [_host(p) for p in model.parameters()]


def test_pin_memory_loader_trains_as_on_cpu(monkeypatch):
    """``pin_memory=True`` works, with one warning that pinning is not
    available to a Python backend (Note [Pinned memory])."""
    from lazytpu.device import serialization

    monkeypatch.setattr(serialization, "_warned_pinning", [])
    with pytest.warns(UserWarning, match="no pinned-memory allocator") as caught:
        on_tpu = _train_from_loader("tpu", pin_memory=True)
    assert sum("pinned-memory" in str(w.message) for w in caught) == 1
    torch.testing.assert_close(on_tpu, _train_from_loader("cpu"))
    x = torch.arange(3.0)
    pinned = x.pin_memory()
    assert pinned is not x and torch.equal(pinned, x) and not pinned.is_pinned()


_WORKERS_SCRIPT = """
import sys, torch, lazytpu
from torch.utils.data import DataLoader, Dataset, TensorDataset


class Makes(Dataset):  # returns tpu tensors it makes
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((2,), float(i), device="tpu")


def receive(queue, answer):
    t = queue.get()
    answer.put((t.device.type, t.tolist()))


def receive_arguments(t, model, answer):
    w = model.weight
    answer.put((t.device.type, t.tolist(), w.device.type, isinstance(w, torch.nn.Parameter), w.tolist()))


def run(context, dataset, collate):
    kw = {} if collate is None else {"collate_fn": collate}
    try:
        for _ in DataLoader(dataset, batch_size=2, num_workers=1, multiprocessing_context=context, timeout=120, **kw):
            pass
    except RuntimeError as exc:
        return str(exc)
    return "no error"


if __name__ == "__main__":
    held = TensorDataset(torch.arange(8.0, device="tpu").reshape(4, 2))  # tpu tensors made in the parent
    cases = {
        "fork_held_default": ("fork", held, None),
        "fork_held_list": ("fork", held, list),
        "spawn_makes_default": ("spawn", Makes(), None),
        "spawn_makes_list": ("spawn", Makes(), list),
    }
    for name, case in cases.items():
        print(name, "|", run(*case).replace(chr(10), " "), flush=True)
    cpu = TensorDataset(torch.arange(8.0).reshape(4, 2))  # CPU tensors in pinning fork workers: fine
    total = sum(b[0].to("tpu").sum().item() for b in DataLoader(cpu, batch_size=2, num_workers=2, pin_memory=True))
    print("cpu_workers_pinned |", total)
    ctx = torch.multiprocessing.get_context("spawn")  # outside a DataLoader: a copy, on tpu where received
    queue, answer = ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=receive, args=(queue, answer))
    child.start()
    queue.put(torch.arange(4.0, device="tpu")[1:3])
    print("sent |", answer.get(timeout=120))
    child.join()
    model = torch.nn.Linear(2, 1, bias=False).to("tpu")  # a process's arguments are pickled before it starts
    torch.nn.init.constant_(model.weight, 3.0)
    child = ctx.Process(target=receive_arguments, args=(torch.arange(4.0, device="tpu")[1:3], model, answer))
    child.start()
    print("sent_as_arguments |", answer.get(timeout=120))
    child.join()
"""


def test_dataloader_workers_returning_tpu_tensors_get_a_clear_error(tmp_path):
    """fork and spawn workers whose dataset returns tpu tensors: torch's worker
    error with lazytpu's reason, never a crash (Note [tpu tensors between processes]);
    forked workers raise no JAX warning about the fork (Note [Fork] in runtime/platform)."""
    import subprocess
    import sys

    script = tmp_path / "workers.py"
    script.write_text(_WORKERS_SCRIPT)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=500)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "os.fork() was called" not in out.stderr
    results = dict(line.split(" | ", 1) for line in out.stdout.splitlines())
    reason = "DataLoader worker 0 made a batch of tpu tensors, which cannot leave a worker process"
    for name in ("fork_held_default", "fork_held_list", "spawn_makes_default", "spawn_makes_list"):
        assert reason in results[name], (name, results[name])
    assert "Caught RuntimeError in DataLoader worker process 0" in results["spawn_makes_default"]
    assert results["cpu_workers_pinned"] == "28.0"
    assert results["sent"] == "('tpu', [1.0, 2.0])"
    assert results["sent_as_arguments"] == "('tpu', [1.0, 2.0], 'tpu', True, [[3.0, 3.0]])"


def test_share_memory_of_tpu_tensors_warns_that_processes_get_copies(monkeypatch):
    from lazytpu.device import serialization

    monkeypatch.setattr(serialization, "_warned_sharing", [])
    model = torch.nn.Linear(2, 2).to("tpu")
    with pytest.warns(UserWarning, match="tpu memory is not shared between processes") as caught:
        assert model.share_memory() is model
        model.weight.share_memory_()
    assert len(caught) == 1 and caught[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.zeros(2).share_memory_()  # CPU tensors: torch's own, silent


def test_device_context_switches_the_current_device_and_back():
    before = torch.tpu.current_device()
    with torch.tpu.device("tpu:0") as ctx:
        assert torch.tpu.current_device() == 0 and isinstance(ctx, torch.tpu.device)
    with torch.tpu.device(None), torch.tpu.device(-1):
        assert torch.tpu.current_device() == before
    if torch.tpu.device_count() > 1:
        with torch.tpu.device(1):
            assert torch.tpu.current_device() == 1
        assert torch.tpu.current_device() == before
    with pytest.raises(RuntimeError, match="does not exist"):
        with torch.tpu.device(torch.tpu.device_count()):
            pass
    torch.tpu.set_device(-1)  # changes nothing, as torch.cuda.set_device (it raised)
    assert torch.tpu.current_device() == before


def test_an_upload_changes_dtype_only_when_no_tensor_holds_it():
    """A tpu storage's first upload (uint8, by torch's storage copy) becomes the
    dtype of the tensor set to it when nothing else holds it, whatever the
    calling convention adds to a count of references (once torch.compile had
    run, a fixed count kept bool tensors from loading)."""
    from lazytpu.frontend import hostio

    memory = torch.UntypedStorage(3, device="tpu")
    memory.copy_(torch.tensor([1, 0, 1], dtype=torch.uint8).untyped_storage())
    held = hostio.held_by(memory)
    assert held.storage is not None and held.storage.value.aval.dtype is torch.uint8
    extra = held.storage
    assert not hostio._held_only_by(held)
    del extra
    assert hostio._held_only_by(held)
    flags = torch.empty(0, dtype=torch.bool, device="tpu").set_(memory, 0, (3,), (1,))
    assert flags.tolist() == [True, False, True]


def _promoting_ops(device):
    ints = torch.arange(1, 5, device=device, dtype=torch.int32)
    small = torch.tensor([0, 1, 7], dtype=torch.uint8, device=device)
    return [
        ints / ints,
        torch.sqrt(ints),
        small + 5.5,
        torch.true_divide(ints, 2),
        torch.full((2,), 1.5, device=device),
        torch.arange(0.0, 2.0, device=device),
        torch.ones(2, dtype=torch.complex64, device=device) + torch.tensor(5.5, dtype=torch.float64, device=device),
        ints.float().mean() + ints,
    ]


def test_a_new_default_dtype_applies_to_calls_made_before_it():
    """See Note [Default dtype]: the same calls under float32 and then float64 as
    the default dtype give CPU's dtypes each time; the second time used to
    reuse the plans of the first (int / int stayed float32)."""
    try:
        for default in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(default)
            expected = _promoting_ops("cpu")
            actual = _promoting_ops("tpu")
            assert [t.dtype for t in actual] == [t.dtype for t in expected], default
            for a, e in zip(actual, expected):
                torch.testing.assert_close(a.cpu(), e)
    finally:
        torch.set_default_dtype(torch.float32)


def test_values_recorded_under_another_default_dtype_are_computed_in_it():
    """Values recorded under float64 as the default dtype and read after it changed
    back are computed in float64 (they were computed in float32 and labelled
    float64: 1/3 off by 1e-8); and the reverse. See Note [Default dtype in programs]."""
    ints, divisors = torch.tensor([1, 2**31 - 1, 7]), torch.tensor([3, 3, 10])
    try:
        for recorded, read in ((torch.float64, torch.float32), (torch.float32, torch.float64)):
            torch.set_default_dtype(recorded)
            expected = [ints / divisors, ints * 0.1, ints + 0.1, torch.sqrt(ints), ints**0.5, ints * 1j]
            t, d = ints.to("tpu"), divisors.to("tpu")
            actual = [t / d, t * 0.1, t + 0.1, torch.sqrt(t), t**0.5, t * 1j]
            torch.set_default_dtype(read)
            for a, e in zip(actual, expected):
                assert torch.equal(a.cpu(), e), (recorded, e)
    finally:
        torch.set_default_dtype(torch.float32)


FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float(), b.float()
    return a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_float8_tensors_as_cpu(dtype):
    """float8 tensors move, convert (CPU's saturation: inf -> 448 in e4m3fn, where
    XLA gives NaN), index and concatenate as on CPU, and the ops CPU does not
    compute in float8 raise its error (was: a TypeError at .to("tpu"), or a
    deferred lowering failure for a float8 made on tpu)."""
    values = torch.tensor([0.0, -0.0, 1e-3, 0.3, -3.3, 447.0, 449.0, 500.0, 6e4, 1e6, float("inf"), float("-inf")])
    noise = torch.randn(20, generator=torch.Generator().manual_seed(0))
    values = torch.cat([values, torch.tensor([float("nan")]), noise])
    for source in (torch.float32, torch.float64, torch.bfloat16, torch.int64):
        v = values.to(source) if source.is_floating_point else values.nan_to_num(0, 0, 0).clamp(-1e4, 1e4).to(source)
        assert _same_values(v.to("tpu").to(dtype).cpu(), v.to(dtype)), source
    x = values.to(dtype)
    t = x.to("tpu")
    index = torch.tensor([3, 0, 3, 12])
    assert _same_values(t.cpu(), x)
    assert _same_values(t.index_select(0, index.to("tpu")).cpu(), x.index_select(0, index))
    assert _same_values(torch.cat([t, t]).cpu(), torch.cat([x, x]))
    assert _same_values(torch.zeros(3, dtype=dtype, device="tpu").cpu(), torch.zeros(3, dtype=dtype))
    assert _same_values(t.float().cpu(), x.float())
    with pytest.raises(NotImplementedError, match="not implemented for 'Float8"):
        t * 2
    with pytest.raises(NotImplementedError, match="not implemented for 'Float8"):
        t.sum()


@pytest.mark.parametrize("device", [None, "tpu"])
def test_tensor_of_a_list_of_zero_dim_tpu_tensors(device):
    """``torch.tensor([loss_a, loss_b])`` reads each element's value, as from CUDA
    tensors (an internal assert in torch's fallback dispatch before)."""
    values = torch.tensor([5, 7, 9]).to("tpu")
    halves = values.float() * 0.5
    made = torch.tensor([values[0], values[1], 3], device=device)
    assert made.device.type == (device or "cpu")
    assert made.tolist() == [5, 7, 3] and made.dtype is torch.int64
    assert torch.tensor([[halves[0]], [halves[2]]], device=device).cpu().tolist() == [[2.5], [4.5]]


@pytest.mark.parametrize("make", ["embedding", "embedding_bag", "gather"])
def test_sparse_gradients_are_the_dense_values_of_cpus(make, eager_mode):
    """(Note [Sparse gradients]) tpu has no sparse layouts: ``nn.Embedding(sparse=True)``'s and
    ``gather(sparse_grad=True)``'s backward raised NotImplementedError (a sparse COO tensor made on
    tpu). They get the dense gradient of CPU's values, and SGD steps as on CPU."""
    torch.manual_seed(0)
    weight = torch.randn(10, 3)
    index = torch.tensor([1, 2, 1, 5])

    def step(device):
        w = nn.Parameter(weight.to(device))
        i = index.to(device)
        if make == "embedding":
            out = F.embedding(i, w, padding_idx=2, sparse=True)
        elif make == "embedding_bag":
            out = F.embedding_bag(i, w, torch.tensor([0, 2], device=device), mode="sum", sparse=True)
        else:
            out = torch.gather(w, 1, i.view(4, 1).remainder(3), sparse_grad=True)
        out.pow(2).sum().backward()
        grad = w.grad.to_dense().cpu()
        torch.optim.SGD([w], lr=0.1).step()
        return grad, w.detach().cpu()

    with mode(eager_mode):
        got = step("tpu")
    want = step("cpu")
    torch.testing.assert_close(got, want)
