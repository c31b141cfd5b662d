"""Fake quantization (quantization-aware training) on tpu: CPU torch's results
bit for bit, rounding ties included, without a CPU fallback (Note [Fake
quantization] in lazytpu.lowering.quantize)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import no_fallback

aten = torch.ops.aten

# random values, exact multiples of the scales, halfway between two levels (the ties), and past both ends
X = torch.cat(
    [
        torch.randn(400, generator=torch.Generator().manual_seed(0)) * 10,
        torch.arange(-300, 300) * 0.1,
        (torch.arange(-300, 300) + 0.5) * 0.25,
        torch.tensor([0.0, -0.0, 12.75, -12.75, 1e6, -1e6]),
    ]
)
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
QPARAMS = [(0.1, 3, 0, 255), (0.25, 0, -128, 127), (0.037, -5, -8, 7), (1 / 3, 10, 0, 15)]


def _same(fn, *args):
    expected = fn(*args)
    with no_fallback():
        actual = fn(*[a.to("tpu") if isinstance(a, torch.Tensor) else a for a in args])
        for e, a in zip(expected, actual, strict=True):
            assert e.dtype == a.dtype and torch.equal(e, a.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale, zero_point, quant_min, quant_max", QPARAMS)
def test_per_tensor_fake_quantize_is_cpus(dtype, scale, zero_point, quant_min, quant_max):
    x = X.to(dtype)
    _same(lambda v: aten.fake_quantize_per_tensor_affine_cachemask(v, scale, zero_point, quant_min, quant_max), x)
    for zp, enabled in [(zero_point, 1), (zero_point + 0.7, 1), (zero_point, 0)]:  # a float zero point is truncated
        _same(
            lambda v, s, z, e: aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
                v, s, z, e, quant_min, quant_max
            ),
            x,
            torch.tensor([scale]),
            torch.tensor([zp]),
            torch.tensor([enabled]),
        )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_point_dtype", [torch.int32, torch.float32, torch.float16])
@pytest.mark.parametrize("axis", [0, 1])
def test_per_channel_fake_quantize_is_cpus(dtype, zero_point_dtype, axis):
    """A floating zero point is added before the rounding, an integer one after."""
    x = X[:1600].to(dtype).reshape(400, 4)
    x = x if axis == 1 else x.t().contiguous()
    zero_points = torch.tensor([0, 3, -2, 5]).to(zero_point_dtype) + (0.5 if zero_point_dtype.is_floating_point else 0)
    scales = torch.tensor([0.1, 0.25, 0.037, 1 / 3])
    _same(
        lambda v, s, z: aten.fake_quantize_per_channel_affine_cachemask(v, s, z, axis, -8, 15), x, scales, zero_points
    )


def test_fake_quantize_module_trains_as_on_cpu():
    """A QAT FakeQuantize layer: its straight-through gradient is CPU's; the
    observer's scale is one ulp off CPU's (a division by 255: Note [Exact
    quotients]), so the module's output is compared with that scale."""
    fq = torch.ao.quantization.FakeQuantize(
        observer=torch.ao.quantization.MovingAverageMinMaxObserver, quant_min=0, quant_max=255
    )
    fq_tpu = copy.deepcopy(fq).to("tpu")
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)) * 3
    with no_fallback():
        fq_tpu(x.to("tpu"))
        fq_tpu.disable_observer()
        fq.scale.copy_(fq_tpu.scale.cpu())
        fq.zero_point.copy_(fq_tpu.zero_point.cpu())
        fq.disable_observer()
        a, b = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
        expected, actual = fq(a), fq_tpu(b)
        (expected * torch.arange(16.0)).sum().backward()
        (actual * torch.arange(16.0).to("tpu")).sum().backward()
        assert torch.equal(actual.cpu(), expected) and torch.equal(b.grad.cpu(), a.grad)
