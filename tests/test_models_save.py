"""``torch.save`` / ``torch.load`` of ``tpu`` state dicts (also ``weights_only=True``)."""

from __future__ import annotations

import pickle
import warnings
import zipfile

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import no_fallback


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))


def _x() -> torch.Tensor:
    return torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("weights_only", [False, True])
def test_state_dict_round_trip(tmp_path, weights_only):
    model = _model().to("tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with torch.tpu.set_eager_mode("defer"):
        F.cross_entropy(model(_x().to("tpu")), torch.tensor([0, 3], device="tpu")).backward()
        opt.step()  # saving must run the pending update (the step's sync may be off)
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)
    state = torch.load(path, weights_only=weights_only)
    assert all(v.device.type == "tpu" for v in state.values())
    assert state.keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert state[key].dtype == value.dtype
        assert torch.equal(state[key].cpu(), value.cpu()), key
    restored = _model().to("tpu")
    restored.load_state_dict(state)
    model.eval()
    restored.eval()
    x = _x().to("tpu")
    assert torch.equal(restored(x).cpu(), model(x).cpu())
    on_cpu = torch.load(path, map_location="cpu", weights_only=weights_only)
    assert all(v.device.type == "cpu" for v in on_cpu.values())


def test_load_cpu_checkpoint_into_tpu_model(tmp_path):
    """The other direction, which needs no pickling of tpu tensors."""
    source = _model()
    path = tmp_path / "cpu.pt"
    torch.save(source.state_dict(), path)
    model = _model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1)
    with no_fallback():  # what earlier tests fell back on does not count
        model.to("tpu").load_state_dict(torch.load(path, weights_only=True))
        source.eval()
        model.eval()
        torch.testing.assert_close(model(_x().to("tpu")).cpu(), source(_x()), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("weights_only", [False, True])
@pytest.mark.parametrize("map_location", [None, "cpu"])
@pytest.mark.parametrize("requires_grad", [True, False])
def test_parameter_saved_alone_reloads_as_parameter(tmp_path, weights_only, map_location, requires_grad):
    """``torch.save(param)`` reloads a Parameter, with its Python attributes, as on CPU."""
    loaded = {}
    for device in ("cpu", "tpu"):
        param = nn.Parameter(torch.arange(6.0).reshape(2, 3).to(device), requires_grad=requires_grad)
        param._is_hf_initialized = True
        path = tmp_path / f"{device}.pt"
        torch.save(param, path)
        loaded[device] = torch.load(path, weights_only=weights_only, map_location=map_location)
    cpu, tpu = loaded["cpu"], loaded["tpu"]
    assert isinstance(tpu, nn.Parameter) and isinstance(cpu, nn.Parameter)
    assert tpu.device.type == (map_location or "tpu")
    assert (type(tpu) is nn.Parameter) == (map_location == "cpu")
    assert tpu.requires_grad == cpu.requires_grad == requires_grad
    assert tpu._is_hf_initialized is True and cpu._is_hf_initialized is True
    assert torch.equal(tpu.detach().cpu(), cpu.detach())


@pytest.mark.parametrize("map_location", [None, "cpu"])
@pytest.mark.parametrize("conj", [False, True])
def test_a_tensors_python_attributes_survive_saving_and_pickling(tmp_path, map_location, conj):
    """As CPU keeps them (``_rebuild_from_type_v2``); a tpu tensor lost them, a Parameter did not."""
    for device in ("cpu", "tpu"):
        t = torch.tensor([1 + 2j, 3j]).to(device)
        t = t.conj() if conj else t
        t.tag = "kept"
        torch.save(t, tmp_path / "t.pt")
        for copied in (torch.load(tmp_path / "t.pt", map_location=map_location), pickle.loads(pickle.dumps(t))):
            assert copied.tag == "kept" and copied.device == t.device if map_location is None else copied.tag == "kept"
            assert torch.equal(copied.cpu().resolve_conj(), t.cpu().resolve_conj())


@pytest.mark.parametrize("map_location", [None, "cpu"])
def test_a_storage_saved_with_its_tensors_is_one_record_and_shares_with_them(tmp_path, map_location):
    """A tpu tensor's untyped storage saved or pickled alone recursed without end (torch took it for no
    storage); saved with tensors on it, it is their record, as on CPU, and loads sharing with them."""
    for device in ("cpu", "tpu"):
        u = torch.arange(4, dtype=torch.uint8, device=device)
        torch.save([u[1:], u.untyped_storage()], tmp_path / "s.pt")
        records = [n for n in zipfile.ZipFile(tmp_path / "s.pt").namelist() if "/data/" in n]
        view, storage = torch.load(tmp_path / "s.pt", map_location=map_location, weights_only=False)
        storage.fill_(7)
        assert len(records) == 1 and view.tolist() == [7, 7, 7] and view.device == storage.device
        with pytest.raises(RuntimeError, match="Cannot save multiple tensors or storages that view the same data"):
            floats = u.float()
            torch.save([floats, floats.untyped_storage()], tmp_path / "x.pt")  # float32 and uint8 views of it
    alone = pickle.loads(pickle.dumps(torch.arange(3.0, device="tpu").untyped_storage()))
    assert alone.device.type == "tpu" and bytes(alone.cpu()) == bytes(torch.arange(3.0).untyped_storage())


def test_a_typed_storage_pickles_and_saves_in_the_legacy_format(tmp_path):
    """``pickle`` of ``t.storage()`` (a TypedStorage: torch's legacy format) raised "invalid python
    storage"; it loads back on tpu with the tensor's values (a copy: see docs/limitations.md)."""
    t = torch.arange(5.0, device="tpu") * 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        torch.save(t.storage(), tmp_path / "legacy.pt", _use_new_zipfile_serialization=False)
        for copied in (pickle.loads(pickle.dumps(t.storage())), torch.load(tmp_path / "legacy.pt", weights_only=False)):
            assert copied.device == t.device and copied.dtype == t.dtype and copied.tolist() == t.tolist()


def test_whole_tied_model_round_trip(tmp_path):
    """Pickling a whole ``tpu`` module keeps its tied Parameters one object."""
    model = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5))
    model[1].weight = model[0].weight
    model.to("tpu")
    path = tmp_path / "whole.pt"
    torch.save(model, path)
    restored = torch.load(path, weights_only=False)
    assert restored[1].weight is restored[0].weight
    assert isinstance(restored[0].weight, nn.Parameter) and restored[0].weight.device.type == "tpu"
    ids = torch.tensor([0, 3, 4], device="tpu")
    assert torch.equal(restored(ids).cpu(), model(ids).cpu())


def test_data_pointers_tell_shared_memory_as_on_cpu():
    """See Note [Data pointers]: views share their storage's pointer and sit at
    their offset in it; separate storages never overlap; every pointer was 0
    before, and ``untyped_storage().data_ptr()`` raised."""
    for device in ("cpu", "tpu"):
        x = torch.randn(15, 4, device=device)
        view, row, copy = x.reshape(20, 3), x[2], x.t().reshape(20, 3)
        other = torch.randn(15, 4, device=device)
        assert view.data_ptr() == x.data_ptr() != 0, device
        assert row.data_ptr() - x.data_ptr() == 2 * 4 * x.element_size(), device
        assert view.untyped_storage().data_ptr() == row.untyped_storage().data_ptr() == x.data_ptr(), device
        assert copy.untyped_storage().data_ptr() != x.untyped_storage().data_ptr(), device
        for y in (copy, other):
            start, end = y.data_ptr(), y.data_ptr() + y.untyped_storage().nbytes()
            assert end <= x.data_ptr() or start >= x.data_ptr() + x.untyped_storage().nbytes(), device
        x.add_(1)  # a write keeps the storage, and its pointer
        assert x.data_ptr() == view.data_ptr()
        # nothing to point at: 0, as CPU's allocator and c10 answer
        empty = torch.empty(2, 0, device=device)
        assert empty.data_ptr() == empty.untyped_storage().data_ptr() == x[15:].data_ptr() == 0, device


def test_transformers_save_pretrained_of_a_tpu_model_round_trips(tmp_path):
    """save_pretrained finds tied weights by storage pointers (safetensors'
    storage_ptr): on a tpu model it raised "Attempted to access the data
    pointer on an invalid python storage"."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2, n_positions=16, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).to("tpu")
    model.save_pretrained(tmp_path)
    loaded = GPT2LMHeadModel.from_pretrained(tmp_path)
    saved, restored = model.state_dict(), loaded.state_dict()
    assert saved.keys() == restored.keys()
    for name, value in saved.items():
        assert torch.equal(value.cpu(), restored[name]), name
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()  # still tied
