"""``torch.inference_mode()`` on tpu: composite ops arrive whole below autograd
(Note [Composite ops below autograd] in lazytpu.frontend.dispatch), and must
view or copy as CPU torch's kernels do."""

from __future__ import annotations

import pytest
import torch

import lazytpu


def _pair(*shape):
    cpu = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    return cpu, cpu.to("tpu")


@pytest.fixture(params=["defer", "strict"])
def mode(request):
    with torch.tpu.set_eager_mode(request.param):
        yield request.param


def test_a_model_runs_and_its_results_are_read(mode):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    tpu = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.GELU(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    x = torch.randn(5, 3)
    with torch.inference_mode():
        want, got = cpu(x), tpu(x.to("tpu"))
        assert got.is_inference()
        torch.testing.assert_close(got.cpu(), want)  # read inside the block
        assert got.argmax(-1).tolist() == want.argmax(-1).tolist()
        assert got.sum().item() == pytest.approx(want.sum().item(), rel=1e-5)
    torch.testing.assert_close(got.cpu(), want)  # and after it


@pytest.mark.parametrize(
    "name, op",
    [
        ("reshape_copies", lambda t: t.t().reshape(-1)),
        ("reshape_views", lambda t: t.reshape(2, 6)),
        ("contiguous_copies", lambda t: t.t().contiguous()),
        ("flatten", lambda t: t.t().flatten()),
        ("to_dtype", lambda t: t.to(torch.int32)),
        ("to_double", lambda t: t.double() * 3),
        ("view_as", lambda t: t.view_as(torch.empty(4, 3, device=t.device))),
        ("unflatten", lambda t: t.unflatten(1, (2, 2))),
    ],
)
def test_composite_ops_equal_cpu(name, op, mode):
    cpu, tpu = _pair(3, 4)
    with torch.inference_mode():
        want, got = op(cpu), op(tpu)
        assert got.dtype == want.dtype and got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(got.cpu(), want)


@pytest.mark.parametrize(
    "name, op, writes_through",
    [
        ("reshape_of_contiguous_is_a_view", lambda t: t.reshape(12), True),
        ("reshape_of_transposed_is_a_copy", lambda t: t.t().reshape(12), False),
        ("contiguous_of_contiguous_is_itself", lambda t: t.contiguous(), True),
        ("to_same_dtype_is_itself", lambda t: t.to(torch.float32), True),
    ],
)
def test_writes_through_composite_results_reach_the_input_as_on_cpu(name, op, writes_through, mode):
    cpu, tpu = _pair(3, 4)
    with torch.inference_mode():
        cpu, tpu = cpu.clone(), tpu.clone()  # inference tensors, writable in the block
        op(cpu).add_(100)
        op(tpu).add_(100)
        assert torch.equal(tpu.cpu(), cpu)
        assert (cpu.max().item() >= 100) is writes_through


def test_nothing_falls_back_to_cpu():
    lazytpu.metrics.reset()
    _, tpu = _pair(3, 4)
    with torch.inference_mode():
        (tpu.t().reshape(-1).to(torch.float64) * 2).flatten().cpu()
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


def test_views_are_inference_tensors_as_on_cpu():
    """(Note [Views in inference mode])"""
    cpu, tpu = _pair(3, 4)
    with torch.inference_mode():
        made_cpu, made_tpu = cpu * 2, tpu * 2
        for op in (lambda t: t.t(), lambda t: t[1:], lambda t: t.view(12), lambda t: t.unsqueeze(0)):
            assert op(tpu).is_inference() is op(cpu).is_inference() is False
            assert op(made_tpu).is_inference() is op(made_cpu).is_inference() is True
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        made_cpu.add_(1)
    with pytest.raises(RuntimeError, match="Inplace update to inference tensor outside InferenceMode"):
        made_tpu.add_(1)
