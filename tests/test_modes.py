"""strict / defer / strict-blocking: selection and what each executes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import programs_run

import lazytpu

EagerMode = torch.tpu.EagerMode


def _ten_ops_then_cpu(x):
    def body():
        y = x
        for i in range(10):
            y = y * 1.5 if i % 2 else y + 1
        y.cpu()

    return body


@pytest.mark.parametrize(
    "mode, expected",
    [(EagerMode.DEFER_AND_FUSE, 1), (EagerMode.DEFER_NEVER, 10), (EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING, 10)],
)
def test_ten_elementwise_ops_programs(mode, expected):
    x = torch.randn(16, device="tpu")
    with torch.tpu.set_eager_mode(mode):
        assert programs_run(_ten_ops_then_cpu(x)) == expected


def test_strict_results_equal_defer():
    x = torch.randn(5, 5)
    outs = []
    for mode in ("defer", "strict", "strict-blocking"):
        with torch.tpu.set_eager_mode(mode):
            t = x.to("tpu")
            outs.append(((t + 1) * t - 2).cpu())
    for out in outs:
        torch.testing.assert_close(out, (x + 1) * x - 2)


def test_eager_mode_property_and_context_manager():
    assert torch.tpu.eager_mode is EagerMode.DEFER_AND_FUSE
    with torch.tpu.set_eager_mode(EagerMode.DEFER_NEVER):
        assert torch.tpu.eager_mode is EagerMode.DEFER_NEVER
        with torch.tpu.set_eager_mode("strict-blocking"):
            assert torch.tpu.eager_mode is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
        assert torch.tpu.eager_mode is EagerMode.DEFER_NEVER
    assert torch.tpu.eager_mode is EagerMode.DEFER_AND_FUSE
    torch.tpu.eager_mode = "strict"
    try:
        assert torch.tpu.eager_mode is EagerMode.DEFER_NEVER
    finally:
        torch.tpu.eager_mode = EagerMode.DEFER_AND_FUSE
    with pytest.raises(ValueError, match="defer, strict, strict-blocking"):
        torch.tpu.eager_mode = "fast"


def test_mode_switch_flushes_pending_work():
    x = torch.ones(3, device="tpu") + 1
    assert x._lt_storage.pending
    with torch.tpu.set_eager_mode("strict"):
        assert not x._lt_storage.pending


def test_backward_runs_in_the_selected_mode():
    """Autograd records backward ops on its own thread; the mode reaches it."""
    w = torch.randn(4, 4).to("tpu").requires_grad_()
    with torch.tpu.set_eager_mode("strict"):
        loss = (w * w).sum()
        lazytpu.metrics.reset()
        loss.backward()
        snap = lazytpu.metrics.snapshot()
        assert snap["programs_executed"] >= 3  # mul backward ops ran one by one
        assert not w.grad._lt_storage.pending  # nothing left for a later sync
    torch.testing.assert_close(w.grad.cpu(), 2 * w.detach().cpu())


def _run(env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, **env_extra)
    code = "import torch, lazytpu; print(torch.tpu.eager_mode.name)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.parametrize(
    "env, name",
    [
        ({"TORCHTPU_EAGER_MODE": "strict"}, "DEFER_NEVER"),
        ({"TORCHTPU_EAGER_MODE": "defer"}, "DEFER_AND_FUSE"),
        ({"TORCHTPU_EAGER_MODE": "strict-blocking"}, "DEFER_NEVER_AND_LAUNCH_BLOCKING"),
        ({"TORCH_TPU_DEFER_AND_FUSE": "1"}, "DEFER_AND_FUSE"),
        ({"TORCH_TPU_DEFER_AND_FUSE": "0"}, "DEFER_NEVER"),
    ],
)
def test_mode_from_environment(env, name):
    out = _run(env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == name


def test_bad_mode_fails_at_import():
    out = _run({"TORCHTPU_EAGER_MODE": "turbo"})
    assert out.returncode != 0
    assert "ValueError" in out.stderr
    assert "defer, strict, strict-blocking" in out.stderr


def test_set_eager_mode_as_a_plain_call_switches():
    try:
        torch.tpu.set_eager_mode("strict")
        assert torch.tpu.eager_mode is EagerMode.DEFER_NEVER
    finally:
        torch.tpu.set_eager_mode("defer")
    assert torch.tpu.eager_mode is EagerMode.DEFER_AND_FUSE


def test_docs_say_what_set_eager_mode_does():
    """The guide, the API reference and the architecture say what the two tests above hold."""
    from pathlib import Path

    docs = Path(__file__).resolve().parent.parent / "docs"
    said = {name: " ".join((docs / name).read_text().split()) for name in ("modes.md", "api.md", "architecture.md")}
    assert "Called without `with`, `set_eager_mode(mode)` switches the mode from then on" in said["modes.md"]
    assert "Called without `with`, it switches the mode from then on" in said["api.md"]
    assert "`set_eager_mode` (a switch, and a context manager that restores the mode)" in said["architecture.md"]
    for text in said.values():
        assert "does nothing" not in text.split("set_eager_mode", 1)[-1][:300]
        assert "context manager only" not in text


HOST_COPIES = {
    "to": lambda x, d: x.to(d),
    "to_transposed": lambda x, d: x.t().to(d),
    "tensor": lambda x, d: torch.tensor(x.tolist(), device=d),
    "copy_into_empty": lambda x, d: torch.empty(x.shape, device=d).copy_(x),
}


@pytest.mark.parametrize("copy", sorted(HOST_COPIES))
@pytest.mark.parametrize("mode", ["defer", "strict"])
def test_copy_from_host_runs_no_program(copy, mode):
    """Torch's ``empty`` then ``copy_`` of a host tensor runs no program (strict mode
    ran the ``empty``), and the value is the host's (Note [Uninitialized factories])."""
    x = torch.randn(3, 4)
    expected = HOST_COPIES[copy](x, "cpu")
    with torch.tpu.set_eager_mode(mode):
        out = []
        assert programs_run(lambda: out.append(HOST_COPIES[copy](x, "tpu"))) == 0
        assert out[0].stride() == expected.stride()
        torch.testing.assert_close(out[0].cpu(), expected)


def test_strict_empty_runs_when_read():
    with torch.tpu.set_eager_mode("strict"):
        assert torch.empty(2, 3, device="tpu").cpu().shape == (2, 3)
        assert programs_run(lambda: torch.empty(5, device="tpu").fill_(2.0)) == 1
