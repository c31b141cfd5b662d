"""Mixed precision: ``torch.autocast("tpu", dtype=torch.bfloat16)`` (Note [Autocast on PrivateUse1])."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from test_models_cnn import _train, classifier

import lazytpu
from lazytpu.device import autocast as tpu_autocast

BF16 = torch.bfloat16


def test_amp_is_available():
    assert torch.bfloat16 in torch.tpu.get_amp_supported_dtype()
    assert torch.amp.is_autocast_available("tpu")
    with torch.autocast("tpu", dtype=BF16):
        assert torch.is_autocast_enabled("tpu")
        assert torch.get_autocast_dtype("tpu") == BF16
    assert not torch.is_autocast_enabled("tpu")


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to("tpu")


# (what, fn, expected dtype under bfloat16 autocast)
CASES = {
    "linear": (lambda: F.linear(_x(4, 8), _x(3, 8), _x(3)), BF16),
    "matmul": (lambda: _x(4, 8) @ _x(8, 2), BF16),
    "bmm": (lambda: torch.bmm(_x(2, 3, 4), _x(2, 4, 5)), BF16),
    "conv2d": (lambda: F.conv2d(_x(1, 3, 6, 6), _x(4, 3, 3, 3)), BF16),
    "sdpa": (lambda: F.scaled_dot_product_attention(_x(1, 2, 4, 8), _x(1, 2, 4, 8), _x(1, 2, 4, 8)), BF16),
    "softmax": (lambda: torch.softmax(_x(4, 8).to(BF16), -1), torch.float32),
    "log_softmax_explicit_dtype": (lambda: torch.log_softmax(_x(4, 8).to(BF16), -1, dtype=BF16), BF16),
    "sum": (lambda: _x(4, 8).to(BF16).sum(), torch.float32),
    "exp": (lambda: _x(4).to(BF16).exp(), torch.float32),
    "layer_norm": (lambda: F.layer_norm(_x(4, 8).to(BF16), (8,)), torch.float32),
    "rms_norm": (lambda: F.rms_norm(_x(4, 8).to(BF16), (8,)), torch.float32),  # CUDA's fp32 list (it stayed bf16)
    "cross_entropy": (
        lambda: F.cross_entropy(_x(4, 8).to(BF16), torch.tensor([0, 1, 2, 3], device="tpu")),
        torch.float32,
    ),
    "mse_loss": (lambda: F.mse_loss(_x(4).to(BF16), _x(4).to(BF16)), torch.float32),
    "cat_promotes": (lambda: torch.cat([_x(2).to(BF16), _x(2)]), torch.float32),
    "relu_keeps": (lambda: F.relu(_x(4).to(BF16)), BF16),
    "float64_untouched": (lambda: _x(2, 2).double() @ _x(2, 2).double(), torch.float64),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_autocast_policy(name):
    fn, expected = CASES[name]
    with torch.autocast("tpu", dtype=BF16):
        out = fn()
    assert out.dtype == expected
    assert torch.isfinite(out.float()).all()


NO_LOW_PRECISION_KERNEL = {
    "rfft": lambda h: torch.fft.rfft(h).abs(),
    "fft2": lambda h: torch.fft.fft2(h).real,
    "polar": lambda h: torch.polar(h.abs(), h).imag,
    "svdvals": torch.linalg.svdvals,
    "qr": lambda h: torch.linalg.qr(h)[1].abs(),
    "solve_mixed": lambda h: torch.linalg.solve(torch.eye(4, device=h.device) * 3 + h[:, :4] * 0.1, h),
    "quantile": lambda h: torch.quantile(h, 0.3, dim=1),
    "avg_pool3d": lambda h: F.avg_pool3d(h.reshape(1, 1, 2, 2, 6), (2, 2, 2)),
}


@pytest.mark.parametrize("name", sorted(NO_LOW_PRECISION_KERNEL))
def test_ops_without_low_precision_kernels_run_in_float32_as_on_cpu(name):
    # A bf16 activation reaching them raised on tpu ("Unsupported dtype BFloat16"); CPU's list runs them in float32
    fn = NO_LOW_PRECISION_KERNEL[name]
    results = []
    for device in ("cpu", "tpu"):
        lin = nn.Linear(6, 6).to(device)
        with torch.no_grad():
            lin.weight.copy_(torch.linspace(-1, 1, 36).reshape(6, 6))
            lin.bias.fill_(0.25)
        with torch.autocast(device, dtype=BF16):
            h = lin(torch.linspace(-2, 2, 24).reshape(4, 6).to(device))
            assert h.dtype == BF16
            results.append(fn(h))
    cpu, tpu = results
    assert tpu.dtype == cpu.dtype == torch.float32
    torch.testing.assert_close(tpu.cpu(), cpu, rtol=1e-4, atol=1e-4)


def test_binary_cross_entropy_is_refused_under_autocast():
    """As CUDA's autocast bans it (torch's message); ``binary_cross_entropy_with_logits`` is the safe one."""
    p, t = torch.rand(4, device="tpu"), torch.rand(4, device="tpu")
    with torch.autocast("tpu", dtype=BF16):
        with pytest.raises(RuntimeError, match="binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast"):
            F.binary_cross_entropy(p, t)
        assert F.binary_cross_entropy_with_logits(p, t).dtype == torch.float32
    assert F.binary_cross_entropy(p, t).dtype == torch.float32


def test_autocast_disabled_region_and_cpu_tensors():
    a, b = _x(4, 8), _x(8, 2)
    with torch.autocast("tpu", dtype=BF16):
        with torch.autocast("tpu", enabled=False):
            assert (a @ b).dtype == torch.float32
        assert (a.cpu() @ b.cpu()).dtype == torch.float32  # CPU autocast is not on
        assert (a @ b).dtype == BF16


def test_policy_tables_name_real_ops():
    for specs, _ in tpu_autocast.POLICIES.values():
        for spec in specs:
            assert tpu_autocast._overloads(spec), spec
    assert tpu_autocast.policy_of(torch.ops.aten.mm.default) == "lower"
    assert tpu_autocast.policy_of(torch.ops.aten.sum.dim_IntList) == "fp32_set_opt_dtype"
    assert tpu_autocast.policy_of(torch.ops.aten.relu.default) is None


def test_autocast_backward_gives_float32_grads():
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 4)).to("tpu")
    with torch.autocast("tpu", dtype=BF16):
        out = model(_x(5, 8))
        loss = F.cross_entropy(out, torch.tensor([0, 1, 2, 3, 0], device="tpu"))
    assert out.dtype == BF16 and loss.dtype == torch.float32
    loss.backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


def test_bf16_cnn_training_matches_cpu_autocast():
    """Convolutions and linear layers in bfloat16, losses in float32, 10 steps."""
    cpu_losses = _train(classifier(), "cpu", autocast=BF16)
    lazytpu.metrics.reset()
    tpu_losses = _train(classifier(), "tpu", autocast=BF16)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}
    # bfloat16 tolerance (the two autocast policies differ in a few ops, e.g. CPU keeps batch norm in bf16)
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=1.6e-2, atol=1e-2)
    assert tpu_losses[-1] < tpu_losses[0]


def _torchvision_ops():
    """torchvision's detection ops; where it is not installed, stand-ins with their schemas and
    their CPU kernels' dtype checks (lazytpu's autocast kernels for them are registered by name)."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        if not hasattr(torch.ops.torchvision, "roi_align"):
            lib = torch.library.Library("torchvision", "DEF")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define(
                "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor"
            )
            lib.impl("nms", _stand_in_nms, "CPU")
            lib.impl("roi_align", _stand_in_roi_align, "CPU")
            _STAND_INS.append(lib)
    return torch.ops.torchvision


_STAND_INS = []


def _float32_only(*tensors):
    if any(t.dtype != tensors[0].dtype for t in tensors) or tensors[0].dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"not implemented for {[t.dtype for t in tensors]}")  # as torchvision's CPU kernels


def _stand_in_nms(dets, scores, iou_threshold):
    _float32_only(dets, scores)
    return torch.argsort(scores, descending=True)


def _stand_in_roi_align(x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    _float32_only(x, rois)
    return x[rois[:, 0].long(), :, :pooled_height, :pooled_width] * rois[:, 1:].sum(1)[:, None, None, None]


def test_torchvision_detection_ops_run_in_float32_under_autocast_as_on_cuda():
    """A bfloat16 feature map reaching roi_align (its kernels are float32 only) runs it in
    float32 and gets bfloat16 back; nms too (Note [torchvision under autocast])."""
    ops = _torchvision_ops()
    x, rois = torch.randn(1, 4, 8, 8), torch.tensor([[0, 1.0, 1.0, 6.0, 6.0], [0, 2.0, 0.0, 5.0, 7.0]])
    boxes, scores = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11.0]]), torch.tensor([0.8, 0.9])
    expected = ops.roi_align(x.bfloat16().float(), rois, 1.0, 2, 2, 2, False).bfloat16()
    with torch.autocast("tpu", dtype=BF16):
        features = x.to("tpu").bfloat16()
        out = ops.roi_align(features, rois.to("tpu"), 1.0, 2, 2, 2, False)
        keep = ops.nms(boxes.to("tpu"), scores.to("tpu").bfloat16(), 0.5)
    assert out.dtype == BF16 and keep.dtype == torch.int64
    torch.testing.assert_close(out.cpu(), expected)
    assert keep.cpu().tolist() == ops.nms(boxes, scores, 0.5).tolist()
