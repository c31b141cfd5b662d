"""Activation checkpointing saves device memory on ``tpu`` (Note [Recomputation
barrier] in lazytpu/device/checkpoint.py), with CPU torch's results and gradients.

Peaks are measured with ``torch.tpu.max_memory_allocated`` (on XLA:CPU,
lazytpu's count of its buffers plus each program's temporaries, Note [Device
memory] in lazytpu/runtime/memory.py), as the rise over what is allocated
before the step, so that buffers other tests left alive do not count.
"""

from __future__ import annotations

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn as nn
from jax import export
from torch.utils.checkpoint import checkpoint

from lazytpu import _config
from lazytpu.device import checkpoint as tpu_checkpoint
from lazytpu.lowering.barrier import optimization_barrier

WIDTH, BATCH, LAYERS = 64, 256, 8
RATIO = 0.6  # the bound: checkpointed peak <= 0.6x the plain one


class MLP(nn.Module):
    def __init__(self, checkpointed: bool, dropout: float = 0.0, layers: int = LAYERS) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(
                nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Dropout(dropout), nn.Linear(4 * WIDTH, WIDTH), nn.Tanh()
            )
            for _ in range(layers)
        )
        self.checkpointed = checkpointed

    def forward(self, x):
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.checkpointed else layer(x)
        return x.square().mean()


def _step(device: str, checkpointed: bool, segments: bool = False, dropout: float = 0.0, layers: int = LAYERS):
    """Loss and gradients of one forward and backward, and on tpu its peak rise in bytes."""
    torch.manual_seed(0)
    model = MLP(checkpointed, dropout, layers).to(device)
    x = torch.randn(BATCH, WIDTH).to(device)
    rise = None
    if device == "tpu":
        torch.tpu.synchronize()
        gc.collect()
        torch.tpu.reset_peak_memory_stats()
        before = torch.tpu.memory_allocated()
    torch.manual_seed(1)
    with _config.STEP_SEGMENTS.override(segments):  # False: forward and backward are one fused program
        loss = model(x)
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        if device == "tpu":
            torch.tpu.synchronize()
            rise = torch.tpu.max_memory_allocated() - before
    return loss.detach().cpu(), [g.cpu() for g in grads], rise


def _assert_same(actual, expected):
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-5, atol=1e-6)
    for a, e in zip(actual[1], expected[1]):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("segments", [False, True], ids=["fused", "step_segments"])
def test_checkpointing_saves_memory_with_cpus_results(segments):
    plain = _step("tpu", checkpointed=False, segments=segments)
    checkpointed = _step("tpu", checkpointed=True, segments=segments)
    _assert_same(plain, _step("cpu", checkpointed=False))
    _assert_same(checkpointed, _step("cpu", checkpointed=True))
    ratio = checkpointed[2] / plain[2]
    assert ratio <= RATIO, f"checkpointed peak {checkpointed[2]} B is {ratio:.2f}x the plain {plain[2]} B"


def test_without_the_barrier_checkpointing_saves_nothing(monkeypatch):
    """What the barrier is for: XLA merges the recomputation back (Note [Recomputation barrier])."""
    monkeypatch.setattr(tpu_checkpoint, "ordered_copies", lambda tensors: tensors)
    plain = _step("tpu", checkpointed=False)
    checkpointed = _step("tpu", checkpointed=True)
    _assert_same(checkpointed, plain)
    assert checkpointed[2] / plain[2] > 0.9


def test_a_dropout_mask_is_recomputed_as_it_was_drawn():
    """The gradients are those of the forward's mask (Note [Recomputed random ops] in lazytpu/device/checkpoint.py)."""
    plain = _step("tpu", checkpointed=False, dropout=0.5, layers=2)
    _assert_same(_step("tpu", checkpointed=True, dropout=0.5, layers=2), plain)


def _dropped(t):
    return torch.nn.functional.dropout(t * 2, 0.5, training=True)


@pytest.mark.parametrize("sync", [False, True], ids=["pending", "synced"])
@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_a_checkpoints_recomputation_draws_what_the_forward_drew(reentrant, sync):
    """Its gradient is that of the forward's mask, and what is drawn after the
    backward is what would be drawn had the recomputation not run; also after a
    sync between them (as step segments make), which ran the program that
    advanced the key the forward had."""
    x = torch.randn(64, 32).to("tpu").requires_grad_()
    torch.manual_seed(3)
    y = checkpoint(_dropped, x, use_reentrant=reentrant)
    if sync:
        torch.tpu.synchronize()
    y.sum().backward()
    after = torch.rand(8, device="tpu")
    torch.testing.assert_close(x.grad.cpu(), (y != 0).float().cpu() * 4)
    torch.manual_seed(3)
    _dropped(x)
    torch.testing.assert_close(after.cpu(), torch.rand(8, device="tpu").cpu())


_PASSED = {  # non-reentrant: reentrant checkpointing takes tensors requiring grad only as positional arguments
    "list": lambda x: checkpoint(lambda xs: _dropped(xs[0]), [x], use_reentrant=False),
    "dict": lambda x: checkpoint(lambda d: _dropped(d["x"]), {"x": x}, use_reentrant=False),
    "keyword": lambda x: checkpoint(lambda *, t: _dropped(t), t=x, use_reentrant=False),
}


@pytest.mark.parametrize("passed", list(_PASSED))
def test_the_forwards_mask_is_kept_wherever_the_input_is_passed(passed):
    """A tpu input in a list, a dict or a keyword argument: its device's state is
    kept as CPU's is (torch's protocol looks only at positional tensors: the
    recomputation drew a new mask and the gradient was another mask's)."""
    x = torch.randn(64, 32).to("tpu").requires_grad_()
    y = _PASSED[passed](x)
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), (y != 0).float().cpu() * 4)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_without_preserve_rng_state_the_recomputation_draws_anew(reentrant):
    """As on CPU: ``preserve_rng_state=False`` keeps no state, and the gradient is another mask's."""
    x = torch.randn(64, 32).to("tpu").requires_grad_()
    y = checkpoint(_dropped, x, use_reentrant=reentrant, preserve_rng_state=False)
    y.sum().backward()
    assert not torch.equal(x.grad.cpu(), (y != 0).float().cpu() * 4)


def test_strict_mode_checkpointing_matches_cpu():
    with torch.tpu.set_eager_mode("strict"):
        _assert_same(_step("tpu", checkpointed=True, layers=2), _step("cpu", checkpointed=True, layers=2))


def _shared(a, b, scale):
    return (a.t() @ b).tanh() * scale + a.sum()


def test_views_and_shared_inputs_of_a_checkpoint():
    x = torch.randn(6, 6)
    results = {}
    for device in ("cpu", "tpu"):
        base = x.clone().to(device).requires_grad_()
        y = checkpoint(_shared, base.t(), base, 3.0, use_reentrant=False)
        (y * y).sum().backward()
        results[device] = (y.detach().cpu(), [base.grad.cpu()])
    _assert_same(results["tpu"], results["cpu"])


def _lowered(platform: str) -> str:
    shapes = [jax.ShapeDtypeStruct((4,), jnp.float32), jax.ShapeDtypeStruct((2, 2), jnp.float32)]
    fn = jax.jit(lambda x, tie: optimization_barrier(x, tie, tied=True))
    return export.export(fn, platforms=[platform])(*shapes).mlir_module()


def test_the_barrier_on_cpu_is_a_conditional_and_elsewhere_an_optimization_barrier():
    cpu = _lowered("cpu")
    assert "stablehlo.optimization_barrier" not in cpu and ("stablehlo.case" in cpu or "stablehlo.if" in cpu)
    for platform in ("tpu", "cuda"):  # lowered without the device: what their compilers get
        assert "stablehlo.optimization_barrier" in _lowered(platform)


@pytest.mark.parametrize("tie", [np.nan, -np.inf, 0.0], ids=["nan", "-inf", "zero"])
def test_the_barrier_keeps_every_value(tie):
    x = jnp.array([-0.0, np.nan, np.inf, 1.5], jnp.float32)
    n = jnp.array([3, -7], jnp.int64)
    out = jax.jit(lambda x, n, t: optimization_barrier(x, n, t, tied=True))(x, n, jnp.full((2,), tie))
    assert len(out) == 2
    np.testing.assert_array_equal(np.asarray(out[0]).view(np.int32), np.asarray(x).view(np.int32))  # bits: -0.0 too
    np.testing.assert_array_equal(np.asarray(out[1]), np.asarray(n))
