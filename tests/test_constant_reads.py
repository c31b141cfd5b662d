"""Host reads of values computed from Python numbers alone (Note [Constant reads]
in lazytpu/engine_flush.py): answered without a program after their first, the
lane's other pending ops left pending, and torch's values and errors kept."""

from __future__ import annotations

import pytest
import torch

import lazytpu


def _snap() -> dict:
    return lazytpu.metrics.snapshot()


def test_a_constant_read_runs_no_program_after_its_first():
    w = torch.randn(8).to("tpu")
    lazytpu.sync()
    for i in range(3):
        y = w * 2  # pending, reads a device buffer
        lazytpu.metrics.reset()
        found = bool(((torch.arange(8, device="tpu") + 1) == 3).any())
        assert found is True
        assert _snap()["programs_executed"] == (1 if i == 0 else 0)
        assert _snap()["constant_reads"] == 1
        assert y._lt_storage.pending  # the read computed its own value alone
        torch.testing.assert_close(y.cpu(), w.cpu() * 2)


@pytest.mark.parametrize("offset", [0, 1, -2, 0.5, -0.0])
def test_constant_reads_follow_their_numbers(offset):
    """The kept value belongs to the numbers it was computed from: another
    offset (a lifted number, Note [Scalar specialization]) is another value."""
    got = ((torch.arange(4, device="tpu") + offset) * 1.5).sum().item()
    assert got == ((torch.arange(4) + offset) * 1.5).sum().item()
    again = torch.full((2,), offset, device="tpu").tolist()
    assert [repr(v) for v in again] == [repr(v) for v in torch.full((2,), offset).tolist()]  # -0.0 stays -0.0


def test_random_values_are_never_kept():
    a = torch.rand(3, device="tpu").sum().item()
    b = torch.rand(3, device="tpu").sum().item()
    assert a != b


def test_a_checked_constant_read_raises_torchs_error_every_time():
    """A value that a value check guards (an index out of range) takes the
    lane's flush, which raises torch's error; nothing is kept for it."""
    for _ in range(2):
        index = torch.full((1,), 5, device="tpu")
        with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 4"):
            torch.arange(4, device="tpu")[index].item()
        with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 4"):
            torch.arange(4)[torch.full((1,), 5)].item()


def test_a_large_value_is_not_kept():
    lazytpu.sync()
    lazytpu.metrics.reset()
    big = torch.ones(4096, device="tpu").cpu()  # 16 KiB: the lane's flush, as any read
    assert torch.equal(big, torch.ones(4096))
    assert _snap()["constant_reads"] == 0


def test_zero_and_negative_zero_are_two_values():
    for value in (0.0, -0.0, 0.0, -0.0):
        got = torch.full((2,), value, device="tpu").tolist()
        assert [repr(v) for v in got] == [repr(value)] * 2


def test_a_counter_read_every_step_compiles_a_few_programs():
    """A value that changes between reads (``add_`` on a tensor made from
    numbers) is bound to its result at its read, as a flush binds it: the next
    ``add_`` reads that result, instead of a chain one op longer each time
    (a new program at every read)."""
    lazytpu.sync()
    lazytpu.metrics.reset()
    count = torch.zeros((), device="tpu")
    for i in range(20):
        count.add_(1)
        assert count.item() == i + 1
    assert _snap()["programs_compiled"] <= 3
    assert _snap()["programs_executed"] == 20
