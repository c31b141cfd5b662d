"""``torch.save`` / ``torch.load`` keep the storage sharing of ``tpu`` tensors as CPU torch does.

Each case builds the same objects on CPU and on ``tpu``, saves and loads both,
and checks the loaded tensors against CPU torch's: values, dtype, shape,
strides, offset, ``requires_grad``, Parameter-ness, and which tensors share a
storage — by writing through each loaded tensor in turn and comparing every
tensor after each write, and, loaded to CPU, by their storages themselves.
"""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import lazytpu

DTYPES = (torch.float32, torch.bfloat16, torch.int64, torch.bool)


def _base(device, dtype=torch.float32, n=24):
    return torch.arange(n).remainder(5).to(dtype).to(device)


def _views(device, dtype):
    x = _base(device, dtype).reshape(4, 6)
    return {
        "x": x,
        "slice": x[1:3],
        "t": x.t(),
        "narrow": x.narrow(1, 2, 3),
        "view": x.view(6, 4),
        "detach": x.detach(),
        "flat_tail": x.view(-1)[5:17:3],
    }


def _views_in_a_list(device, dtype):
    x = _base(device, dtype).reshape(4, 6)
    return [x.select(1, 4), x, x[2:].t(), [x[0]]]


def _offset_and_gaps(device, dtype):
    """Storages whose only tensors start past their beginning or skip elements."""
    return {
        "offset": _base(device, dtype, 20)[3:],
        "gaps": _base(device, dtype, 30).reshape(5, 6)[1:, ::2],
        "alone": _base(device, dtype, 10)[7],
    }


def _pending(device, dtype):
    """Saved before they are computed: the save computes them."""
    x = _base(device, dtype).reshape(4, 6)
    y = (x + x) if dtype is not torch.bool else ~x
    return {"y": y, "y_t": y.t(), "y_row": y[2], "other": _base(device, dtype, 5) * 1}


def _parameters(device, dtype):
    p = nn.Parameter(_base(device, torch.float32, 12).reshape(3, 4))
    frozen = nn.Parameter(_base(device, torch.float32, 6), requires_grad=False)
    return {"p": p, "p_rows": p[1:], "p_detached": p.detach(), "frozen": frozen, "frozen_view": frozen.view(2, 3)}


CASES = {
    "views": _views,
    "views_in_a_list": _views_in_a_list,
    "offset_and_gaps": _offset_and_gaps,
    "pending": _pending,
    "parameters": _parameters,
}


def _leaves(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _leaves(v)]
    return [t for v in obj for t in _leaves(v)]


def _round_trip(obj, target, map_location, weights_only):
    if isinstance(target, io.BytesIO):
        torch.save(obj, target)
        target.seek(0)
    else:
        torch.save(obj, target)
    return torch.load(target, map_location=map_location, weights_only=weights_only)


def _storage_groups(tensors) -> list[int]:
    """For each tensor, the index of the first tensor on the same storage."""
    ptrs = [t.untyped_storage().data_ptr() for t in tensors]
    return [ptrs.index(p) for p in ptrs]


def _write(t: torch.Tensor, step: int) -> None:
    with torch.no_grad():
        if t.dtype is torch.bool:
            t.logical_not_()
        else:
            t.add_(step + 1)


def assert_loaded_like_cpu(actual, expected, device_type: str) -> None:
    """``actual`` (loaded from a tpu checkpoint) matches ``expected`` (the
    same objects saved and loaded on CPU), sharing included."""
    assert type(actual) is type(expected)
    if isinstance(expected, dict):
        assert list(actual) == list(expected)
    got, want = _leaves(actual), _leaves(expected)
    assert len(got) == len(want)
    for a, e in zip(got, want):
        assert a.device.type == device_type
        assert (a.dtype, a.shape, a.stride(), a.storage_offset()) == (e.dtype, e.shape, e.stride(), e.storage_offset())
        assert a.requires_grad == e.requires_grad
        assert isinstance(a, nn.Parameter) == isinstance(e, nn.Parameter)
        assert torch.equal(a.detach().cpu(), e.detach())
    if device_type == "cpu":
        assert _storage_groups(got) == _storage_groups(want)
        assert [t.untyped_storage().nbytes() for t in got] == [t.untyped_storage().nbytes() for t in want]
    for step, (a, e) in enumerate(zip(got, want)):
        _write(a, step)
        _write(e, step)
        for i, (b, f) in enumerate(zip(got, want)):
            assert torch.equal(b.detach().cpu(), f.detach()), f"after writing tensor {step}, tensor {i} differs"


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("map_location", [None, "cpu"])
@pytest.mark.parametrize("case", list(CASES))
def test_loaded_tensors_share_as_on_cpu(tmp_path, case, map_location, weights_only):
    make = CASES[case]
    expected = _round_trip(make("cpu", torch.float32), tmp_path / "cpu.pt", None, weights_only)
    actual = _round_trip(make("tpu", torch.float32), tmp_path / "tpu.pt", map_location, weights_only)
    assert_loaded_like_cpu(actual, expected, map_location or "tpu")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", ["views", "offset_and_gaps", "pending"])
def test_dtypes_round_trip_through_a_buffer(case, dtype):
    make = CASES[case]
    for map_location in (None, "cpu"):
        expected = _round_trip(make("cpu", dtype), io.BytesIO(), None, True)
        actual = _round_trip(make("tpu", dtype), io.BytesIO(), map_location, True)
        assert_loaded_like_cpu(actual, expected, map_location or "tpu")


def test_separate_saves_do_not_share(tmp_path):
    """Two files hold two storages, on tpu as on CPU."""
    loaded = {}
    for device in ("cpu", "tpu"):
        x = _base(device).reshape(4, 6)
        torch.save(x, tmp_path / f"{device}_x.pt")
        torch.save(x[1:], tmp_path / f"{device}_rows.pt")
        x.add_(1)  # after the first save: the second file still holds the old values
        torch.save(x.t(), tmp_path / f"{device}_t.pt")
        loaded[device] = [torch.load(tmp_path / f"{device}_{name}.pt") for name in ("x", "rows", "t")]
    assert_loaded_like_cpu(loaded["tpu"], loaded["cpu"], "tpu")


def test_save_reads_each_storage_once():
    """The pending tensors are computed by one sync, and each storage is read
    back once for all the tensors on it."""
    x = _base("tpu").reshape(4, 6)
    y = x * 2
    before = lazytpu.metrics.snapshot()
    torch.save({"y": y, "t": y.t(), "row": y[1], "x": x, "x_cols": x[:, 2:]}, io.BytesIO())
    after = lazytpu.metrics.snapshot()
    assert after["syncs"].get("save", 0) - before["syncs"].get("save", 0) == 1
    assert after["bytes_from_device"] - before["bytes_from_device"] == 2 * 24 * 4


def test_tpu_checkpoint_loads_on_cpu_without_lazytpu(tmp_path):
    """Loaded to CPU, a tpu checkpoint is CPU torch's own: one storage per tpu
    storage, the whole storage whatever part of it was saved, and only torch's
    globals (a process that never imports lazytpu loads it)."""
    x = _base("tpu", n=30).reshape(5, 6)
    torch.save({"cols": x[:, 1::2], "row": x[4]}, tmp_path / "tpu.pt")
    check = (
        "import sys, torch\n"
        f"s = torch.load({str(tmp_path / 'tpu.pt')!r}, map_location='cpu', weights_only=True)\n"
        "assert 'lazytpu' not in sys.modules\n"
        "assert type(s['cols']) is torch.Tensor and s['cols'].untyped_storage().nbytes() == 30 * 4\n"
        "assert s['cols'].untyped_storage().data_ptr() == s['row'].untyped_storage().data_ptr()\n"
        "assert s['row'].storage_offset() == 24 and s['cols'].stride() == (6, 2)\n"
    )
    subprocess.run([sys.executable, "-c", check], check=True, timeout=120)


class _TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(7, 4)
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.body(self.embed(ids))))


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("map_location", [None, "cpu"])
def test_tied_weights_state_dict(tmp_path, map_location, weights_only):
    """An embedding tied to the lm head: the state dict's two names load as
    one storage, and load into a model as on CPU."""
    results = {}
    for device, location in (("cpu", None), ("tpu", map_location)):
        torch.manual_seed(0)
        model = _TiedLM().to(device)
        with torch.no_grad():
            model.embed.weight.mul_(2)  # pending on tpu when saved
        state = _round_trip(model.state_dict(), tmp_path / f"{device}.pt", location, weights_only)
        torch.manual_seed(1)
        fresh = _TiedLM().to(state["embed.weight"].device)
        fresh.load_state_dict(state)
        ids = torch.tensor([[0, 3, 6], [2, 2, 5]], device=fresh.embed.weight.device)
        results[device] = (state, fresh(ids).detach())
    (state, out), (cpu_state, cpu_out) = results["tpu"], results["cpu"]
    assert list(cpu_state) == ["embed.weight", "body.weight", "body.bias", "head.weight"]
    torch.testing.assert_close(out.cpu(), cpu_out)
    assert_loaded_like_cpu(state, cpu_state, map_location or "tpu")
