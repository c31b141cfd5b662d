"""Fake quantization (quantization-aware training) on tpu: CPU torch's results
bit for bit, rounding ties included, without a CPU fallback (Note [Fake
quantization] in lazytpu.lowering.quantize)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import no_fallback, programs_compiled

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
    zero_points = torch.tensor([0, 3, -2, 5]).to(zero_point_dtype) + (0.53 if zero_point_dtype.is_floating_point else 0)
    scales = torch.tensor([0.1, 0.25, 0.037, 1 / 3])
    _same(
        lambda v, s, z: aten.fake_quantize_per_channel_affine_cachemask(v, s, z, axis, -8, 15), x, scales, zero_points
    )


@pytest.mark.parametrize("per_channel", [False, True])
def test_fake_quantize_keeps_a_channels_last_layout(per_channel):
    """The output and mask are laid out as CPU's: like a channels-last input."""
    x = X[:72].reshape(2, 4, 3, 3).to(memory_format=torch.channels_last)
    scales, zero_points = torch.tensor([0.1, 0.25, 0.037, 1 / 3]), torch.tensor([0, 3, -2, 5], dtype=torch.int32)

    def fq(v, s, z):
        if per_channel:
            return aten.fake_quantize_per_channel_affine_cachemask(v, s, z, 1, -8, 15)
        return aten.fake_quantize_per_tensor_affine_cachemask(v, 0.1, 3, 0, 255)

    expected = fq(x, scales, zero_points)
    with no_fallback():
        actual = fq(x.to("tpu"), scales.to("tpu"), zero_points.to("tpu"))
    for e, a in zip(expected, actual, strict=True):
        assert a.stride() == e.stride() and torch.equal(a.cpu(), e)


def test_fake_quantize_module_trains_as_on_cpu():
    """A QAT FakeQuantize layer: its observer's scale is CPU's (it was an ulp off: a division by
    255, Note [Exact quotients]), its output and straight-through gradient are CPU's."""
    fq = torch.ao.quantization.FakeQuantize(
        observer=torch.ao.quantization.MovingAverageMinMaxObserver, quant_min=0, quant_max=255
    )
    fq_tpu = copy.deepcopy(fq).to("tpu")
    gen = torch.Generator().manual_seed(1)
    with no_fallback():
        for _ in range(10):
            x = torch.randn(8, 16, generator=gen) * 3
            fq(x)
            fq_tpu(x.to("tpu"))
            assert torch.equal(fq_tpu.scale.cpu(), fq.scale) and torch.equal(fq_tpu.zero_point.cpu(), fq.zero_point)
        fq_tpu.disable_observer()
        fq.disable_observer()
        a, b = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
        expected, actual = fq(a), fq_tpu(b)
        (expected * torch.arange(16.0)).sum().backward()
        (actual * torch.arange(16.0).to("tpu")).sum().backward()
        assert torch.equal(actual.cpu(), expected) and torch.equal(b.grad.cpu(), a.grad)


def _fused_observer(device, x, switches, stats, per_row, symmetric, quant_min, quant_max):
    """``(output, mask, running_min, running_max, scale, zero_point)`` after one call on ``device``."""
    x, *stats = (t.to(device) for t in (x, *stats))
    on = [torch.tensor([v], device=device) for v in switches]
    out, mask = aten._fused_moving_avg_obs_fq_helper(x, *on, *stats, 0.01, quant_min, quant_max, 0, per_row, symmetric)
    return [t.cpu() for t in (out, mask, *stats)]


def _ranges(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Running minima and maxima: wide, small, tiny (a scale below 6.1e-5: raised to it, the range
    stretched), one-sided, zero, never observed (infinities), and [-1, 1] (its zero point lies halfway:
    CPU takes it from the end that adds the smaller error, ``|qmin| + |min / scale|`` against the max's)."""
    g = torch.Generator().manual_seed(seed)
    pairs = torch.randn(n, 2, generator=g) * torch.tensor([10.0, 1e-4, 1e-7, 1.0]).repeat(n // 4 + 1)[:n, None]
    pairs[n // 2 : n // 2 + n // 8, 1] = 0  # all negative
    pairs[n // 2 + n // 8 : n // 2 + n // 4, 0] = 0  # all positive
    pairs[-25:-5] = torch.rand(20, 1, generator=g) * torch.tensor([-4.0, 4.0])  # [-c, c]: halfway zero points
    pairs[-5:] = torch.tensor([[-1.0, 1.0], [0.0, 0.0], [float("inf"), -float("inf")], [-1e-30, 1e-30], [3.0, 3.0]])
    lo, hi = pairs.min(dim=1).values, pairs.max(dim=1).values
    lo[-3], hi[-3] = float("inf"), -float("inf")
    return lo, hi


QRANGES = [(False, 0, 255), (True, -128, 127), (False, 0, 127), (True, -64, 63), (False, -8, 7)]


@pytest.mark.parametrize("symmetric, quant_min, quant_max", QRANGES)
def test_fused_observer_qparams_and_fake_quantization_are_cpus(symmetric, quant_min, quant_max):
    """With the observer off, the scale and zero point chosen from the running range and the fake
    quantization with them equal CPU's bit for bit: 4000 ranges per channel, a few per tensor; the fake
    quantization off leaves the input and the parameters as they were (a mask of ones)."""
    lo, hi = _ranges(4000, 0)
    x = torch.randn(4000, 3, generator=torch.Generator().manual_seed(1)) * hi.abs().clamp(max=1e3)[:, None]
    stats = (lo, hi, torch.ones(4000), torch.zeros(4000, dtype=torch.int32))
    qrange = (symmetric, quant_min, quant_max)
    for switches in [(0, 1), (0, 0)]:
        expected = _fused_observer("cpu", x, switches, stats, True, *qrange)
        with no_fallback():
            actual = _fused_observer("tpu", x, switches, stats, True, *qrange)
        for e, a in zip(expected, actual, strict=True):
            assert e.dtype == a.dtype and torch.equal(e, a)
    for i in [0, 1, 2, 2100, 2700, 3995, 3996, 3997, 3998, 3999]:  # per tensor, 0-d statistics (as the observer's)
        stats = (lo[i].clone(), hi[i].clone(), torch.ones(1), torch.zeros(1, dtype=torch.int32))
        expected = _fused_observer("cpu", x, (0, 1), stats, False, *qrange)
        with no_fallback():
            actual = _fused_observer("tpu", x, (0, 1), stats, False, *qrange)
        for e, a in zip(expected, actual, strict=True):
            assert e.dtype == a.dtype and torch.equal(e, a), (i, e, a)


@pytest.mark.parametrize("per_row", [False, True])
def test_fused_observer_statistics_are_cpus(per_row):
    """Observing: the first input's range taken as it is (empty per-channel statistics resized to one per
    channel, as CPU resizes them), later ones averaged in; off, the statistics stay. The average
    ``r + c * (x - r)`` is one fused multiply-add in XLA (as in CUDA's kernel), CPU rounds the product
    first: within an ulp of CPU's."""
    g = torch.Generator().manual_seed(2)
    inputs = [torch.randn(5, 3, 4, generator=g) * 4 for _ in range(4)]
    inf = torch.tensor(float("inf"))
    cpu = [torch.empty(0), torch.empty(0)] if per_row else [inf, -inf]
    cpu += [torch.ones(1), torch.zeros(1, dtype=torch.int32)]
    tpu = [t.to("tpu") for t in cpu]
    for i, (x, observe) in enumerate(zip(inputs, [1, 1, 0, 1], strict=True)):
        expected = _fused_observer("cpu", x, (observe, 1), cpu, per_row, False, 0, 255)
        with no_fallback():
            actual = _fused_observer("tpu", x, (observe, 1), tpu, per_row, False, 0, 255)
        for e, a in zip(expected[2:4], actual[2:4], strict=True):
            assert e.shape == a.shape == ((5,) if per_row else ())
            if i == 0:
                assert torch.equal(e, a)
            torch.testing.assert_close(a, e, rtol=1.2e-7, atol=0)
        cpu, tpu = expected[2:], [t.to("tpu") for t in actual[2:]]


def test_fused_observer_switches_do_not_recompile():
    """The switches are read inside the program: turning the observer off compiles nothing new."""
    fq = torch.ao.quantization.FusedMovingAvgObsFakeQuantize().to("tpu")
    x = torch.randn(4, 8).to("tpu")
    fq(x).cpu()
    fq(x).cpu()
    fq.disable_observer()
    compiled, out = programs_compiled(lambda: fq(x).cpu())
    assert compiled == 0


@pytest.mark.parametrize(
    "dtype, ch_axis, per_row",
    [(torch.bfloat16, 0, False), (torch.float32, 2, False), (torch.float32, 1, True), (torch.float64, 0, True)],
)
def test_fused_observer_raises_cpus_errors(dtype, ch_axis, per_row):
    """CPU's checks run at the call, without a CPU fallback: a bfloat16 or float64 input, a channel axis
    past the input's dims, per-channel statistics along another axis than the first."""
    x = torch.randn(4, 6, dtype=dtype)
    first = torch.empty(0) if per_row else torch.tensor(float("inf"))
    stats = [first, -first, torch.ones(1), torch.zeros(1, dtype=torch.int32)]
    on = torch.ones(1, dtype=torch.long)
    with pytest.raises(RuntimeError) as cpu:
        aten._fused_moving_avg_obs_fq_helper(x, on, on, *stats, 0.01, 0, 255, ch_axis, per_row)
    tpu = [t.to("tpu") for t in (x, on, *stats)]
    with no_fallback(), pytest.raises(RuntimeError) as raised:
        aten._fused_moving_avg_obs_fq_helper(tpu[0], tpu[1], tpu[1], *tpu[2:], 0.01, 0, 255, ch_axis, per_row)
    assert str(raised.value) == str(cpu.value)


def test_qat_x86_default_trains_as_on_cpu():
    """``get_default_qat_qconfig("x86")`` (fused observers, per-channel weights): no CPU fallback, CPU's
    losses and observer state."""

    def train(device):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 6 * 6, 10)
        )
        model.qconfig = torch.ao.quantization.get_default_qat_qconfig("x86")
        model = torch.ao.quantization.prepare_qat(model.train()).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(3)).to(device)
        losses = []
        for _ in range(3):
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses, {k: v.cpu() for k, v in model.state_dict().items()}

    expected_losses, expected = train("cpu")
    with no_fallback():
        losses, actual = train("tpu")
    assert losses == pytest.approx(expected_losses, rel=1e-5)
    assert expected.keys() == actual.keys()
    for k, e in expected.items():
        assert e.dtype == actual[k].dtype and e.shape == actual[k].shape, k
        torch.testing.assert_close(actual[k], e, rtol=1e-5, atol=1e-6, msg=k)


def _learnable(per_channel: bool, grad_factor: float):
    def run(x, scale, zero_point):
        leaves = [t.clone().requires_grad_() for t in (x, scale, zero_point)]
        if per_channel:
            out = torch._fake_quantize_learnable_per_channel_affine(*leaves, 1, -8, 15, grad_factor)
        else:
            out = torch._fake_quantize_learnable_per_tensor_affine(*leaves, 0, 255, grad_factor)
        weights = torch.linspace(-2, 3, out.numel(), device=out.device).reshape(out.shape)
        (out * weights).sum().backward()
        return out, *(t.grad for t in leaves)

    return run


@pytest.mark.parametrize("grad_factor", [1.0, 0.37])
@pytest.mark.parametrize("per_channel", [False, True])
def test_learnable_fake_quantize_is_cpus(per_channel, grad_factor):
    """LSQ's fake quantization (Note [Learnable fake quantization]): the output and the input's gradient
    are CPU's bit for bit (ties, both ends, zero points between integers); the scale's and zero point's
    gradients are CPU's sums, summed in XLA's order."""
    x = X[:1600].reshape(400, 4)
    if per_channel:
        scale, zero_point = torch.tensor([0.1, 0.25, 0.037, 1 / 3]), torch.tensor([0.5, 3.0, -2.5, 4.7])
    else:
        scale, zero_point = torch.tensor([0.1]), torch.tensor([3.5])
    run = _learnable(per_channel, grad_factor)
    expected = run(x, scale, zero_point)
    with no_fallback():
        actual = [t.cpu() for t in run(x.to("tpu"), scale.to("tpu"), zero_point.to("tpu"))]
    for e, a in zip(expected[:2], actual[:2], strict=True):
        assert e.dtype == a.dtype and torch.equal(e, a)
    for e, a in zip(expected[2:], actual[2:], strict=True):
        assert e.shape == a.shape
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("switches", [(0, 1), (0, 0), (1, 1)])
def test_fused_observer_checks_behind_its_switches(switches):
    """CPU checks the input's dtype only while observing: a float16 input with the observer off is fake
    quantized as on CPU; with it on, CPU's error."""
    x = torch.randn(4, 6).half()
    stats = [torch.tensor(-2.0), torch.tensor(3.0), torch.ones(1), torch.zeros(1, dtype=torch.int32)]
    if switches[0]:
        with pytest.raises(RuntimeError) as cpu:
            _fused_observer("cpu", x, switches, stats, False, False, 0, 255)
        with pytest.raises(RuntimeError) as raised:
            _fused_observer("tpu", x, switches, stats, False, False, 0, 255)
        assert str(raised.value) == str(cpu.value)
        return
    expected = _fused_observer("cpu", x, switches, stats, False, False, 0, 255)
    with no_fallback():
        actual = _fused_observer("tpu", x, switches, stats, False, False, 0, 255)
    for e, a in zip(expected, actual, strict=True):
        assert e.dtype == a.dtype and torch.equal(e, a)


SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 0.0, 1.0, -1.0]).repeat(4, 1).t()
ON = torch.ones(1, dtype=torch.long)
NON_FINITE_CASES = {
    "per tensor": lambda x, s, z, zf: aten.fake_quantize_per_tensor_affine_cachemask(x, 0.1, 3, 0, 255),
    "tensor qparams": lambda x, s, z, zf: aten._fake_quantize_per_tensor_affine_cachemask_tensor_qparams(
        x, s[:1], z[:1], ON.to(x.device), 0, 255
    ),
    "per channel": lambda x, s, z, zf: aten.fake_quantize_per_channel_affine_cachemask(x, s, z, 1, 0, 255),
    "per channel, float zero points": lambda x, s, z, zf: aten.fake_quantize_per_channel_affine_cachemask(
        x, s, zf, 1, 0, 255
    ),
    "learnable per tensor": lambda x, s, z, zf: aten._fake_quantize_learnable_per_tensor_affine_backward(
        torch.ones_like(x), x, s[:1], zf[:1], 0, 255, 1.0
    ),
    "learnable per channel": lambda x, s, z, zf: aten._fake_quantize_learnable_per_channel_affine_backward(
        torch.ones_like(x), x, s, zf, 1, 0, 255, 1.0
    ),
}


@pytest.mark.parametrize("case", list(NON_FINITE_CASES))
def test_fake_quantize_of_non_finite_inputs_is_cpus(case):
    """NaN, infinities and values past int64's range quantize as on CPU: per tensor CPU clamps before its
    integer cast (NaN to quant_min), per channel (and in LSQ's backward) it casts first, as x86 converts
    (NaN, infinities and huge values to INT64_MIN, then quant_min); the masks and gradients follow."""
    fn = NON_FINITE_CASES[case]
    scales, zero_points = torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    args = (SPECIAL, scales, zero_points, zero_points.float() + 0.25)
    expected = fn(*args)
    with no_fallback():
        actual = fn(*(t.to("tpu") for t in args))
    for e, a in zip(expected, actual, strict=True):
        assert e.dtype == a.dtype and torch.equal(e.nan_to_num(7.0), a.cpu().nan_to_num(7.0)), (e, a)


def test_fused_observer_per_channel_along_another_axis_with_the_observer_off():
    """Not observing, CPU fake quantizes per channel along any axis (observing, only along the first)."""
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(4))
    stats = (torch.full((5,), -1.0), torch.full((5,), 1.5), torch.ones(5), torch.zeros(5, dtype=torch.int32))

    def call(device):
        on = [torch.tensor([v], device=device) for v in (0, 1)]
        st = [t.to(device) for t in stats]
        out, mask = aten._fused_moving_avg_obs_fq_helper(x.to(device), *on, *st, 0.01, 0, 255, 1, True, False)
        return [t.cpu() for t in (out, mask, *st)]

    expected = call("cpu")
    with no_fallback():
        actual = call("tpu")
    for e, a in zip(expected, actual, strict=True):
        assert e.dtype == a.dtype and torch.equal(e, a)
