"""Convolutional networks on ``tpu``: the conv, pooling and batch-norm lowerings, then a
small classifier trained 10 steps and evaluated, against CPU torch.

Dropout: CPU and ``tpu`` draw masks from different generators, so the parity
run uses the classifier with its Dropout at ``p=0``; ``test_cnn_trains_with_dropout``
trains it with ``p=0.5`` on ``tpu`` (checking that it learns, without CPU
fallback), and eval-mode inference, where dropout is off, is compared exactly.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import no_fallback, run_both

import lazytpu

# -- ops -----------------------------------------------------------------------

CONVS = {
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), (2, 4, 9, 9), (6, 4, 3, 3), (6,)),
    "conv2d_groups_dilation": (
        lambda x, w, b: F.conv2d(x, w, b, padding=2, dilation=2, groups=2),
        (2, 4, 9, 9),
        (6, 2, 3, 3),
        (6,),
    ),
    "conv2d_same": (lambda x, w, b: F.conv2d(x, w, b, padding="same"), (1, 3, 7, 8), (5, 3, 3, 2), (5,)),
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, stride=2), (2, 3, 11), (5, 3, 3), (5,)),
    "conv3d": (lambda x, w, b: F.conv3d(x, w, b, padding=1, stride=(1, 2, 1)), (1, 2, 5, 6, 4), (3, 2, 3, 3, 3), (3,)),
    "conv_transpose2d": (
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1, groups=2),
        (2, 4, 5, 5),
        (4, 3, 3, 3),
        (6,),
    ),
    "conv_transpose1d_dilation": (
        lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3, dilation=2),
        (2, 3, 6),
        (3, 2, 3),
        (2,),
    ),
    "conv_unbatched": (lambda x, w, b: F.conv2d(x, w, b, padding=1), (3, 6, 6), (4, 3, 3, 3), (4,)),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_convolution_forward_backward(name):
    fn, *shapes = CONVS[name]
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(s, generator=gen).requires_grad_() for s in shapes]
    run_both(fn, *inputs, grad=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("pad", [0, 2, -1])
def test_conv_tbc_forward_backward_without_fallback(pad, dtype):
    """Time-major convolution, summed per kernel tap as CPU sums it: bfloat16 bit-equal, float64 to the last ulps.

    CPU's float64 taps are BLAS gemms whose summation order depends on the machine's vector width, so
    float64 can differ from CPU in the last bits; bfloat16 rounds every tap and must match exactly.
    """
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=gen, dtype=dtype).requires_grad_() for s in ((7, 3, 4), (3, 4, 5), (5,)))
    with no_fallback():
        got = run_both(lambda *a: torch.conv_tbc(*a, pad), x, w, b, grad=True)
    assert got.shape == (7 - 3 + 1 + 2 * pad, 3, 5)
    want = torch.conv_tbc(x, w, b, pad)
    if dtype == torch.bfloat16:
        assert torch.equal(got.cpu(), want)
    elif dtype == torch.float64:
        torch.testing.assert_close(got.cpu(), want, rtol=1e-14, atol=1e-14)


POOLS = {
    "max2d": lambda x: F.max_pool2d(x, 3, 2, 1),
    "max2d_ceil": lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True),
    "max2d_dilation_indices": lambda x: F.max_pool2d(x, 2, 1, 1, dilation=2, return_indices=True),
    "max1d": lambda x: F.max_pool1d(x.flatten(2), 3, 2),
    "max3d": lambda x: F.max_pool3d(x, 2, ceil_mode=True),
    "avg2d": lambda x: F.avg_pool2d(x, 3, 2, 1),
    "avg2d_exclude_pad_ceil": lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    "avg2d_ceil": lambda x: F.avg_pool2d(x, 2, 2, 1, ceil_mode=True),
    "avg2d_divisor": lambda x: F.avg_pool2d(x, 2, divisor_override=3),
    "avg1d": lambda x: F.avg_pool1d(x.flatten(2), 4, 3, 2),
    "avg3d": lambda x: F.avg_pool3d(x, 2, 1),
    "adaptive_avg2d": lambda x: F.adaptive_avg_pool2d(x, (4, 3)),
    "adaptive_avg2d_global": lambda x: F.adaptive_avg_pool2d(x, 1),
    "adaptive_avg1d": lambda x: F.adaptive_avg_pool1d(x.flatten(2), 5),
    "adaptive_avg3d": lambda x: F.adaptive_avg_pool3d(x, (2, 3, 2)),
    "max2d_unbatched": lambda x: F.max_pool2d(x[0], 2),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pooling_forward_backward(name):
    gen = torch.Generator().manual_seed(0)
    shape = (2, 3, 4, 7, 5) if "3d" in name else (2, 3, 9, 7)
    run_both(POOLS[name], torch.randn(shape, generator=gen).requires_grad_(), grad=True)


def test_max_pool3d_of_an_unbatched_channels_last_input_keeps_cpus_layout():
    """CPU gives such an input's outputs channels-last strides (the meta kernel does not):
    PyTorch's test_max_pool3d_ndhwc on tpu."""
    x = torch.randn(1, 3, 6, 5, 4).contiguous(memory_format=torch.channels_last_3d)[0].clone()
    expected = F.max_pool3d(x, (3, 2, 2), return_indices=True)
    actual = F.max_pool3d(x.to("tpu"), (3, 2, 2), return_indices=True)
    for a, e in zip(actual, expected):
        assert a.stride() == e.stride()
        assert torch.equal(a.cpu(), e)


@pytest.mark.parametrize(
    ("dims", "dtype", "transposed", "layout", "channels_last"),
    [
        (2, torch.float32, False, "input", True),
        (2, torch.float64, True, "weight", True),
        (3, torch.float32, True, "input", True),
        (3, torch.float64, False, "both", False),  # CPU's slow 3-d kernel
        (2, torch.float32, False, "none", False),
    ],
)
def test_convolution_outputs_and_gradients_have_cpus_layout(dims, dtype, transposed, layout, channels_last):
    """Channels-last inputs or weights give channels-last outputs and gradients where CPU's
    kernel does (Note [Convolution layouts]): ``view`` and ``is_contiguous`` answer as on CPU."""
    fmt = torch.channels_last if dims == 2 else torch.channels_last_3d
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, *[6] * dims, generator=gen, dtype=dtype)
    w = torch.randn(*((4, 3) if transposed else (3, 4)), *[3] * dims, generator=gen, dtype=dtype)
    if layout in ("input", "both"):
        x = x.contiguous(memory_format=fmt)
    if layout in ("weight", "both"):
        w = w.contiguous(memory_format=fmt)
    conv = F.conv_transpose2d if transposed else F.conv2d
    if dims == 3:
        conv = F.conv_transpose3d if transposed else F.conv3d
    for device in ("cpu", "tpu"):
        xd, wd = x.to(device, copy=True).requires_grad_(), w.to(device, copy=True).requires_grad_()
        out = conv(xd, wd)
        out.backward(torch.ones_like(out))
        if device == "cpu":
            expected = [(t.stride(), t.detach()) for t in (out, xd.grad, wd.grad)]
            continue
        for t, (stride, value) in zip((out, xd.grad, wd.grad), expected):
            assert t.stride() == stride
            torch.testing.assert_close(t.detach().cpu(), value)
    assert out.is_contiguous() != channels_last  # the case tests what it names


class _Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 1, 1))

    def forward(self, x):
        return x * self.weight + 1


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.nn.Conv2d(3, 3, 1),
        lambda: torch.nn.BatchNorm2d(3),
        lambda: torch.nn.BatchNorm3d(3),
        _Scale,
    ],
    ids=["conv2d", "batch_norm2d", "batch_norm3d", "pointwise"],
)
def test_an_empty_channels_last_batch_keeps_cpus_layout(make):
    """A zero batch in channels-last (PyTorch's test_memory_format of the modules): the outputs and input
    gradients have CPU's strides (Notes [Convolution layouts], [Empty pointwise layouts]); an empty
    BatchNorm's output is ``input * weight[0] + bias[0]``, where a meta kernel answers contiguous."""
    torch.manual_seed(0)
    module = make()
    dims = 3 if isinstance(module, torch.nn.BatchNorm3d) else 2
    fmt = torch.channels_last if dims == 2 else torch.channels_last_3d
    x = torch.randn(0, 3, *[4] * dims).contiguous(memory_format=fmt)
    strides = []
    for device in ("cpu", "tpu"):
        xd = x.to(device, copy=True).requires_grad_()
        out = module.to(device)(xd)
        out.backward(torch.ones_like(out))
        strides.append((out.stride(), xd.grad.stride()))
    assert strides[1] == strides[0]
    assert out.stride() == x.stride()  # channels-last (an empty tensor is contiguous in every format)


@pytest.mark.parametrize("factory", ["empty_like", "rand_like", "randn_like", "zeros_like", "full_like"])
def test_like_factories_of_an_empty_channels_last_tensor_keep_its_layout(factory):
    """``torch.rand_like(out)`` of a zero-batch channels-last output (a module test's gradient) is
    channels-last, as on CPU (Note [Empty pointwise layouts])."""
    x = torch.empty(0, 5, 2, 2, 2).contiguous(memory_format=torch.channels_last_3d)
    args = (2.0,) if factory == "full_like" else ()
    expected = getattr(torch, factory)(x, *args).stride()
    assert getattr(torch, factory)(x.to("tpu"), *args).stride() == expected == x.stride()


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize(
    "shape, pad",
    [((3, 4, 5, 6), (1, 2, 1, 2)), ((3, 4, 5, 6, 7), (1, 2, 1, 2, 1, 1)), ((4, 5, 6, 7), (1, 1, 1, 1, 1, 1))],
    ids=["2d", "3d", "3d_unbatched"],
)
def test_padding_a_channels_last_input_keeps_cpus_layout(mode, shape, pad):
    """Reflection and replication padding of a channels-last input give channels-last outputs and
    input gradients, as CPU's kernels do (Note [Suggested layouts]); an unbatched 3-d padding of a
    4-D input with channels-last strides too. Constant padding already did."""
    fmt = torch.channels_last if len(shape) == 4 else torch.channels_last_3d
    x = torch.randn(shape, dtype=torch.float64).contiguous(memory_format=fmt)
    results = []
    for device in ("cpu", "tpu"):
        xd = x.to(device, copy=True).requires_grad_()
        out = F.pad(xd, pad, mode=mode)
        out.backward(torch.arange(out.numel(), dtype=out.dtype).view(out.shape).to(device))
        results.append((out.stride(), xd.grad.stride(), out.detach().cpu(), xd.grad.cpu()))
    (*cpu_strides, cpu_out, cpu_grad), (*tpu_strides, tpu_out, tpu_grad) = results
    assert tpu_strides == cpu_strides
    assert not tpu_out.is_contiguous()
    torch.testing.assert_close(tpu_out, cpu_out, rtol=0, atol=0)
    torch.testing.assert_close(tpu_grad, cpu_grad)


def test_group_norm_of_a_channels_last_batch_of_one_has_cpus_strides():
    """The output is allocated in the input's suggested format (Note [Suggested layouts]): the strides
    of a size-1 batch are CPU's too, not only the format."""
    x = torch.randn(1, 6, 2, 3).contiguous(memory_format=torch.channels_last)
    expected = F.group_norm(x, 3).stride()
    assert F.group_norm(x.to("tpu"), 3).stride() == expected == (36, 1, 18, 6)


def test_max_pool_ties_pick_the_first_index():
    x = torch.tensor([[[[1.0, 3.0, 3.0, 0.0], [3.0, 2.0, 0.0, 3.0]]]])
    run_both(lambda t: F.max_pool2d(t, 2, return_indices=True), x.requires_grad_(), grad=True)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_forward_backward(training):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 5, 5, generator=gen).requires_grad_()
    weight, bias = torch.randn(3, generator=gen).requires_grad_(), torch.randn(3, generator=gen).requires_grad_()
    stats = torch.randn(3, generator=gen), torch.rand(3, generator=gen) + 0.5

    def fn(x, weight, bias, mean, var):
        out = F.batch_norm(x, mean, var, weight, bias, training=training, momentum=0.3, eps=1e-4)
        return out, mean, var  # the running statistics are updated in place in training

    run_both(fn, x, weight, bias, *stats, grad=True)


@pytest.mark.parametrize("op", ["functional", "no_training", "no_stats"])
def test_batch_norm_functional_forms(op):
    aten = torch.ops.aten
    calls = {
        "functional": lambda x, w, b, m, v: aten._native_batch_norm_legit_functional(x, w, b, m, v, True, 0.1, 1e-5),
        # CPU returns empty saved statistics here (other devices, and the meta kernel, the running ones)
        "no_training": lambda x, w, b, m, v: aten._native_batch_norm_legit_no_training(x, w, b, m, v, 0.1, 1e-5)[0],
        "no_stats": lambda x, w, b, m, v: aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5),
    }
    gen = torch.Generator().manual_seed(0)
    args = [
        torch.randn(3, 4, 2, 3, generator=gen),
        torch.randn(4, generator=gen),
        torch.randn(4, generator=gen),
        torch.randn(4, generator=gen),
        torch.rand(4, generator=gen) + 0.5,
    ]
    run_both(calls[op], *args)


def test_instance_norm_forward_backward():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 5, generator=gen).requires_grad_()
    run_both(lambda t: F.instance_norm(t), x, grad=True)


# -- a small classifier ----------------------------------------------------------


def classifier(p: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(p),
        nn.Linear(16, 10),
    )


def _data():
    gen = torch.Generator().manual_seed(1)
    images = [torch.randn(8, 3, 16, 16, generator=gen) for _ in range(3)]
    labels = [torch.randint(0, 10, (8,), generator=gen) for _ in range(3)]
    return images, labels


def _train(model, device: str, steps: int = 10, autocast: torch.dtype | None = None):
    """Losses of ``steps`` SGD steps (forward and loss under autocast to ``autocast`` when given)."""
    images, labels = _data()
    model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        with torch.autocast(device, dtype=autocast, enabled=autocast is not None):
            logits = model(images[step % 3].to(device))
            loss = F.cross_entropy(logits, labels[step % 3].to(device))
        assert logits.dtype == (autocast or torch.float32) and loss.dtype == torch.float32
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack([x.cpu() for x in losses])


def test_cnn_training_and_eval_match_cpu():
    cpu_model, tpu_model = classifier(), classifier()
    cpu_losses = _train(cpu_model, "cpu")
    lazytpu.metrics.reset()
    tpu_losses = _train(tpu_model, "tpu")
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=1e-4, atol=1e-5)
    assert cpu_losses[-1] < cpu_losses[0]
    # parameters and the batch-norm running statistics
    for (key, expected), actual in zip(cpu_model.state_dict().items(), tpu_model.state_dict().values()):
        torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-4, msg=key)
    cpu_model.eval()
    tpu_model.eval()
    images, _ = _data()
    with torch.no_grad():
        torch.testing.assert_close(tpu_model(images[0].to("tpu")).cpu(), cpu_model(images[0]), rtol=1e-4, atol=1e-4)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


def test_cnn_trains_with_dropout():
    model = classifier(p=0.5)
    reference = copy.deepcopy(model)
    lazytpu.metrics.reset()
    losses = _train(model, "tpu", steps=10)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}
    assert losses[-3:].mean() < losses[:3].mean()
    # eval turns dropout off: the trained tpu model agrees with its CPU copy
    reference.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    model.eval()
    reference.eval()
    images, _ = _data()
    with torch.no_grad():
        torch.testing.assert_close(model(images[1].to("tpu")).cpu(), reference(images[1]), rtol=1e-4, atol=1e-4)
