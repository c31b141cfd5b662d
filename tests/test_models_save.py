"""``torch.save`` / ``torch.load`` of ``tpu`` state dicts (also ``weights_only=True``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import lazytpu


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
    model.to("tpu").load_state_dict(torch.load(path, weights_only=True))
    source.eval()
    model.eval()
    torch.testing.assert_close(model(_x().to("tpu")).cpu(), source(_x()), rtol=1e-5, atol=1e-5)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}
