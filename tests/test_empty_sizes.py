"""Ops whose results have no elements compute nothing, whatever their rule would do with zero sizes.

PyTorch's test_pooling.py and nn/test_convolution.py on tpu: adaptive pools of
a batch of 0 or to an output of size 0 failed to lower ("integer modulo by
zero"), and a convolution of zero input channels gave a lowering error
(its rule computed ``out_channels`` channels where CPU gives none).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import MODES, run_both


def _w(*shape):
    return torch.randn(*shape, requires_grad=True)


# name -> (fn, its inputs): forward and backward compared with CPU
CASES = {
    "adaptive_max_pool1d_batch_0": (lambda x: F.adaptive_max_pool1d(x, 3), [_w(0, 4, 10)]),
    "adaptive_max_pool2d_batch_0": (lambda x: F.adaptive_max_pool2d(x, 3), [_w(0, 4, 10, 8)]),
    "adaptive_avg_pool2d_to_0": (lambda x: F.adaptive_avg_pool2d(x, 0), [torch.randn(1, 4, 10, 9)]),
    "adaptive_max_pool2d_to_0": (lambda x: F.adaptive_max_pool2d(x, 0), [torch.randn(1, 4, 10, 9)]),
    "adaptive_max_pool3d_batch_0_indices": (
        lambda x: F.adaptive_max_pool3d(x, 2, return_indices=True),
        [torch.randn(0, 2, 4, 4, 4)],
    ),
    "conv1d_zero_in_channels": (lambda x, w, b: F.conv1d(x, w, b, stride=2), [_w(2, 0, 15), _w(8, 0, 2), _w(8)]),
    "conv2d_batch_0": (lambda x, w, b: F.conv2d(x, w, b), [_w(0, 3, 5, 5), _w(4, 3, 3, 3), _w(4)]),
    "conv3d_batch_and_channels_0": (lambda x, w, b: F.conv3d(x, w, b), [_w(0, 0, 5, 5, 5), _w(2, 0, 2, 2, 2), _w(2)]),
    "conv_transpose2d_batch_0": (lambda x, w: F.conv_transpose2d(x, w), [_w(0, 3, 4, 4), _w(3, 2, 3, 3)]),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("eager_mode", MODES)
def test_empty_results_match_cpu(name, eager_mode):
    fn, inputs = CASES[name]
    run_both(fn, *inputs, mode_name=eager_mode, grad=any(x.requires_grad for x in inputs))


def test_an_empty_output_gradient_raises_cpus_error_from_backward():
    """adaptive_avg_pool2d_backward refuses an empty grad_output: backward() raises it, as on CPU
    (it aborted the process: Note [Errors in backward] in lazytpu/device/backward_errors.py)."""
    for device in ("cpu", "tpu"):
        x = torch.randn(1, 4, 10, 9, device=device, requires_grad=True)
        with pytest.raises(RuntimeError, match="Expected grad_output to have non-zero size"):
            F.adaptive_avg_pool2d(x, 0).sum().backward()
