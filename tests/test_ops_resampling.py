"""uint8 images resampled as CPU torch does, to the bit (Note [uint8 resampling]
in lazytpu/lowering/upsample.py): bilinear and bicubic, with and without
antialiasing and align_corners, up and down, in defer and strict. Before,
the float formula ran in uint8 (weights cast to 0 or 1): up to 255 off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import run_both

# (channels, input size, keyword arguments of F.interpolate)
CASES = {
    "bilinear_up": (3, (4, 5), dict(size=(7, 9), mode="bilinear")),
    "bilinear_down": (1, (9, 11), dict(size=(4, 3), mode="bilinear")),
    "bilinear_align_corners": (3, (4, 4), dict(scale_factor=1.7, mode="bilinear", align_corners=True)),
    "bilinear_scale_kept": (5, (6, 7), dict(scale_factor=0.6, mode="bilinear", recompute_scale_factor=False)),
    "bilinear_one_dim": (3, (5, 6), dict(size=(5, 11), mode="bilinear")),
    "bicubic_up": (3, (4, 5), dict(size=(9, 8), mode="bicubic")),
    "bicubic_down": (5, (12, 10), dict(size=(5, 4), mode="bicubic")),
    "bicubic_align_corners": (1, (4, 6), dict(size=(7, 3), mode="bicubic", align_corners=True)),
    "bilinear_antialias_down": (3, (13, 17), dict(size=(4, 5), mode="bilinear", antialias=True)),
    "bilinear_antialias_up": (1, (3, 4), dict(scale_factor=2.5, mode="bilinear", antialias=True)),
    "bicubic_antialias_down": (5, (20, 9), dict(scale_factor=0.3, mode="bicubic", antialias=True)),
    "bicubic_antialias_up": (3, (5, 5), dict(size=(8, 12), mode="bicubic", antialias=True)),
    "same_size": (3, (4, 5), dict(size=(4, 5), mode="bicubic")),
}


def _image(channels, size):
    torch.manual_seed(channels * 100 + size[0] * 10 + size[1])
    return torch.randint(0, 256, (2, channels, *size), dtype=torch.uint8)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_uint8_matches_cpu_exactly(name, mode):
    channels, size, kwargs = CASES[name]
    run_both(lambda x: F.interpolate(x, **kwargs), _image(channels, size), mode_name=mode, atol=0, rtol=0)


def test_uint8_saturates_where_bicubic_overshoots():
    """Bicubic's negative lobes overshoot a step edge: clamped to 0..255, not wrapped."""
    x = torch.tensor([[[[0, 0, 255, 255], [0, 0, 255, 255]]]], dtype=torch.uint8)
    run_both(lambda t: F.interpolate(t, size=(2, 9), mode="bicubic"), x, atol=0, rtol=0)


def test_uint8_to_width_one_with_many_channels_is_the_rounded_float_result():
    """Where CPU torch's generic uint8 kernel (more than 4 channels, an output
    width of 1) returns values far from the image, tpu keeps the formula: the
    float path's result, rounded, within 1."""
    x = _image(5, (11, 8))
    got = F.interpolate(x.to("tpu"), size=(13, 1), mode="bilinear").cpu()
    reference = F.interpolate(x.float(), size=(13, 1), mode="bilinear").round()
    assert got.dtype == torch.uint8
    assert (got.int() - reference.int()).abs().max() <= 1
