"""Note [Scalar specialization] in lazytpu/fusion/specialize.py: a program's Python
numbers are compiled in as constants until a program of the same structure sees
another value at their position; from then on they are runtime inputs."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import STEP_PROGRAMS

import lazytpu
from lazytpu import engine
from lazytpu.fusion import specialize


@pytest.fixture
def compiled_text():
    """The StableHLO text of each program compiled while the test runs."""
    texts: list[str] = []

    def keep(program, lowered):
        texts.append(lowered.as_text())

    engine.observe("compile", keep)
    yield texts
    engine._OBSERVERS["compile"].remove(keep)


def _compiles(fn) -> int:
    before = lazytpu.metrics.snapshot()["programs_compiled"]
    fn()
    return lazytpu.metrics.snapshot()["programs_compiled"] - before


def test_a_stable_number_is_a_constant_of_the_program(compiled_text):
    x = torch.randn(5, 3)
    t = x.to("tpu")
    lazytpu.sync()
    compiled_text.clear()
    for _ in range(3):
        torch.testing.assert_close((t * 0.3125 + 7.75).cpu(), x * 0.3125 + 7.75)
    (text,) = compiled_text  # one program, reused
    assert "3.125000e-01" in text and "7.750000e+00" in text
    assert "tensor<2xf64>" not in text  # no packed numbers among its parameters


def test_a_changing_number_is_lifted_once_and_then_never_recompiles(compiled_text):
    x = torch.randn(5, 4)
    t = x.to("tpu")
    lazytpu.sync()
    compiled_text.clear()
    counts = []
    for lr in (0.3125, 0.3125, 0.5, 0.75, 0.3125, -2.0, 1e-8):
        counts.append(_compiles(lambda lr=lr: torch.testing.assert_close((t * lr + 7.75).cpu(), x * lr + 7.75)))
    assert counts == [1, 0, 1, 0, 0, 0, 0]
    first, lifted = compiled_text
    assert "3.125000e-01" in first
    # the changing number is a parameter (one packed float), the stable one still a constant
    assert "3.125000e-01" not in lifted and "tensor<1xf64>" in lifted and "7.750000e+00" in lifted
    assert any("Python number changed" in e for e in lazytpu.debug.explain())


def test_ints_and_complex_numbers_are_specialized_and_lifted_too():
    i = torch.arange(-6, 6, dtype=torch.int8)
    c = torch.randn(6, dtype=torch.complex64)
    ti, tc = i.to("tpu"), c.to("tpu")
    counts = []
    for k in (300, 300, 5, -1000):  # int8 wraps as CPU torch's does, as a constant and as an input
        counts.append(_compiles(lambda k=k: torch.testing.assert_close((ti * k).cpu(), i * k)))
    for z in (1j, 1j, 2 - 1j):
        counts.append(_compiles(lambda z=z: torch.testing.assert_close((tc * z).cpu(), c * z)))
    assert counts == [1, 0, 1, 0, 1, 0, 1]


def test_signed_zeros_are_different_numbers():
    """``0.0 == -0.0`` in Python, but a program compiled for one must not run for the other."""
    x = torch.tensor([1.0, -1.0, 0.0, -0.0])
    t = x.to("tpu")
    for z in (0.0, -0.0, 0.0, -0.0):
        got, want = (t * z).cpu(), x * z
        torch.testing.assert_close(got, want)
        assert torch.equal(torch.signbit(got), torch.signbit(want)), z
        torch.testing.assert_close((1 / (t.abs() + 1) / z).cpu(), 1 / (x.abs() + 1) / z)  # +-inf
    for z in (complex(1, 0.0), complex(1, -0.0)):
        tc, c = t.to(torch.complex64), x.to(torch.complex64)
        got, want = (tc * z).cpu(), c * z
        assert torch.equal(torch.signbit(got.imag), torch.signbit(want.imag)), z


def test_nan_and_inf_numbers_match_cpu():
    x = torch.randn(7, 2)
    t = x.to("tpu")
    for v in (float("nan"), float("nan"), float("inf"), -float("inf"), 2.5):
        torch.testing.assert_close((t + v).cpu(), x + v, equal_nan=True)


def test_a_forgotten_specialization_never_runs_a_program_of_other_constants():
    """The program key names its specialization by a serial never reused: with the
    table forgotten (its bound, or cleared alone) and the program still cached, a
    new value specializes again rather than hitting the program of the old one."""
    x = torch.randn(3, 7)
    t = x.to("tpu")
    torch.testing.assert_close((t * 0.375).cpu(), x * 0.375)
    specialize._ENTRIES.clear()
    assert _compiles(lambda: torch.testing.assert_close((t * 0.625).cpu(), x * 0.625)) == 1


def _train(schedule, opt_name: str, steps: int = 10):
    """Per-step compile counts and the losses of a small model trained on tpu, and CPU's losses."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 9), torch.nn.Tanh(), torch.nn.Linear(9, 2))
    data, target = torch.randn(11, 6), torch.randn(11, 2)
    results = []
    for device in ("cpu", "tpu"):
        m = copy.deepcopy(model).to(device)
        if opt_name == "adamw":
            opt = torch.optim.AdamW(m.parameters(), lr=0.01, foreach=True)
        else:
            opt = torch.optim.SGD(m.parameters(), lr=0.05, foreach=True)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        x, y = data.to(device), target.to(device)
        counts, losses = [], []
        for _ in range(steps):
            before = lazytpu.metrics.snapshot()["programs_compiled"]
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(m(x), y)
            loss.backward()
            opt.step()
            sched.step()
            losses.append(loss.item())
            counts.append(lazytpu.metrics.snapshot()["programs_compiled"] - before)
        results.append((counts, losses))
    (_, cpu_losses), (counts, losses) = results
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-5, atol=1e-6)
    return counts


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_a_learning_rate_schedule_compiles_one_program_more(opt_name):
    """A schedule that changes the learning rate at every step compiles the
    optimizer's program once more (its numbers lifted), then nothing. SGD's
    update is the same program from the first step: a constant learning rate
    compiles it once, a schedule twice. AdamW's second step is a program of its
    own (the first one makes the optimizer's state), whose bias corrections
    change at every step: its third compiles once more under either."""
    lazytpu.runtime.clear_caches()
    constant = _train(lambda step: 1.0, opt_name)
    lazytpu.runtime.clear_caches()
    warmup = _train(lambda step: (step + 1) / 10, opt_name)
    assert warmup[0] == constant[0] >= STEP_PROGRAMS
    assert sum(warmup[3:]) == 0 and sum(constant[3:]) == 0
    if opt_name == "sgd":
        assert constant[1:3] == [0, 0] and warmup[1:3] == [1, 0]
    else:
        assert constant[1:3] == warmup[1:3] == [1, 1]


def test_window_offsets_are_lifted_numbers():
    """Note [Window offsets] in lazytpu.frontend.windows: reading and writing
    ``t[:, k]`` in a loop over ``k`` compiles for the first offsets only (it
    compiled one program per offset: PyTorch's test_sort on tpu)."""
    source = torch.arange(60.0).reshape(5, 12)
    for device in ("cpu", "tpu"):
        base = source.to(device)
        target = torch.zeros(5, 12).to(device)
        target.sum().item()
        sums, counts = [], []
        for k in range(1, 12):
            before = lazytpu.metrics.snapshot()["programs_compiled"]
            sums.append(base[:, k].sum().item())
            target[:, k] = base[:, k - 1] * 2
            target.sum().item()
            counts.append(lazytpu.metrics.snapshot()["programs_compiled"] - before)
        if device == "cpu":
            expected = sums, target.tolist()
    assert (sums, target.cpu().tolist()) == expected
    assert sum(counts[3:]) == 0, counts  # every later offset reuses the programs
