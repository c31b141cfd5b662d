"""``torch.tpu`` streams and events: one in-order queue per device (Note [One
queue] in lazytpu/device/streams.py)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import lazytpu
from lazytpu.device import streams


def _event_syncs() -> int:
    return lazytpu.metrics.snapshot()["syncs"]["event"]


def _matmuls(a):
    return (a @ a @ a).tanh().sum()


@pytest.mark.parametrize("wait", ["event", "device"])
def test_elapsed_time_around_a_matmul_is_positive(wait):
    a = torch.randn(384, 384, generator=torch.Generator().manual_seed(0)).to("tpu")
    _matmuls(a).item()  # compiled: the timed run is the device's work
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    total = _matmuls(a)
    end.record()
    if wait == "event":
        end.synchronize()
    else:  # CUDA's pattern: the events' times are taken without asking them
        torch.tpu.synchronize()
    elapsed = start.elapsed_time(end)
    assert isinstance(elapsed, float) and elapsed > 0
    assert start.elapsed_time(end) == elapsed  # the times are kept
    torch.testing.assert_close(total.cpu(), _matmuls(a.cpu()), rtol=1e-3, atol=1e-2)  # a sum of 384 tanh of a x a x a


def test_record_defers_and_synchronize_dispatches():
    """Recording dispatches nothing; synchronize does, and waits (Note [Deferred events])."""
    x = torch.randn(64, 64).to("tpu")
    syncs, ran = _event_syncs(), lazytpu.metrics.snapshot()["programs_executed"]
    y = (x @ x).exp()
    event = torch.tpu.Event()
    event.record()
    z = y + 1  # recorded after the event: fused with the work before it
    assert (_event_syncs(), lazytpu.metrics.snapshot()["programs_executed"]) == (syncs, ran)
    event.synchronize()
    assert _event_syncs() == syncs + 1
    assert lazytpu.metrics.snapshot()["programs_executed"] == ran + 1
    assert event.query()
    assert y._lt_storage.value.buffer.is_ready()  # the event waited for the work recorded before it
    torch.testing.assert_close(y.cpu(), (x.cpu() @ x.cpu()).exp(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(z.cpu(), (x.cpu() @ x.cpu()).exp() + 1, rtol=1e-4, atol=1e-4)


def test_a_timing_event_dispatches_what_is_pending():
    x = torch.randn(64, 64).to("tpu")
    syncs = _event_syncs()
    y = (x @ x).exp()
    event = torch.tpu.Event(enable_timing=True)
    event.record()
    assert _event_syncs() == syncs + 1
    assert not y._lt_storage.pending
    event.synchronize()
    assert y._lt_storage.value.buffer.is_ready()


def test_events_between_ops_keep_one_program():
    """FSDP2's pattern: an event per layer, waited for by the next; one program."""
    x = torch.randn(32, 32).to("tpu")
    torch.tpu.synchronize()
    ran = lazytpu.metrics.snapshot()["programs_executed"]
    stream = torch.tpu.Stream()
    h = x
    for _ in range(4):
        with torch.tpu.stream(stream):
            h = (h @ x).tanh()
            event = stream.record_event()
        torch.tpu.current_stream().wait_event(event)
        h = h * 2
    expected = x.cpu()
    for _ in range(4):
        expected = (expected @ x.cpu()).tanh() * 2
    torch.testing.assert_close(h.cpu(), expected, rtol=1e-4, atol=1e-4)
    assert lazytpu.metrics.snapshot()["programs_executed"] == ran + 1
    assert event.query()


def test_query_is_false_until_the_work_has_run():
    a = torch.randn(1024, 1024).to("tpu")
    torch.tpu.synchronize()
    event = torch.tpu.Event()
    results = [(a @ a).tanh() @ a for _ in range(3)]
    event.record()
    assert event.query() is False  # seconds of work on XLA:CPU, dispatched just now
    event.synchronize()
    assert event.query() is True
    del results


def test_an_event_never_recorded():
    event = torch.tpu.Event(enable_timing=True)
    assert event.query() is True
    event.synchronize()
    with pytest.raises(ValueError, match="must be recorded"):  # CUDA's type (it was a RuntimeError)
        event.elapsed_time(torch.tpu.Event(enable_timing=True))


def test_elapsed_time_needs_timing_events():
    start, end = torch.tpu.Event(), torch.tpu.Event()
    start.record()
    end.record()
    with pytest.raises(ValueError, match="enable_timing=True"):  # torch's own error for these events
        start.elapsed_time(end)


def test_an_event_waits_past_a_donated_buffer():
    x = torch.randn(512, 512).to("tpu")
    y = x @ x
    event = torch.tpu.Event()
    event.record()  # waits for y's buffer
    y.add_(1)  # that buffer is donated to the program writing y's next value
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu() + 1, rtol=1e-4, atol=1e-3)
    event.synchronize()
    assert event.query()


def test_stream_ids_and_the_default_stream():
    s1, s2 = torch.tpu.Stream(), torch.tpu.Stream(priority=-1)
    assert isinstance(s1, torch.Stream) and s1.device == torch.device("tpu", 0)
    assert s1 != s2 and s1.stream_id != 0
    default = torch.tpu.default_stream()
    assert default.stream_id == 0
    assert torch.tpu.current_stream() == default == torch.accelerator.current_stream()


def test_stream_context_sets_and_restores():
    s, inner = torch.tpu.Stream(), torch.tpu.Stream()
    with torch.tpu.stream(s) as entered:
        assert entered is s and torch.tpu.current_stream() == s
        with inner:
            assert torch.tpu.current_stream() == inner
        assert torch.tpu.current_stream() == s
    assert torch.tpu.current_stream() == torch.tpu.default_stream()
    with torch.tpu.stream(None):
        assert torch.tpu.current_stream() == torch.tpu.default_stream()
    torch.tpu.set_stream(s)
    try:
        assert torch.tpu.current_stream() == s
        seen = []
        thread = threading.Thread(target=lambda: seen.append(torch.tpu.current_stream()))
        thread.start()
        thread.join()
        assert seen == [torch.tpu.default_stream()]  # per thread, as CUDA's
    finally:
        torch.tpu.set_stream(torch.tpu.default_stream())


def test_a_side_stream_pattern_of_fsdp_and_dcp():
    """``with stream(s): ...; current_stream().wait_stream(s)`` and events
    between streams, as FSDP2 and torch.distributed.checkpoint use them."""
    x = torch.randn(16, 16)
    t = x.to("tpu")
    side = torch.tpu.Stream()
    with torch.tpu.stream(side):
        y = t * 2 + 1
    torch.tpu.current_stream().wait_stream(side)
    copied = side.record_event()
    torch.tpu.current_stream().wait_event(copied)
    torch.accelerator.current_stream().wait_event(copied)  # torch's own stream takes tpu events
    z = y @ t
    side.synchronize()
    assert side.query()
    torch.testing.assert_close(z.cpu(), (x * 2 + 1) @ x)


def test_stream_synchronize_and_query_see_the_device():
    a = torch.randn(256, 256).to("tpu")
    b = a @ a
    s = torch.tpu.Stream()
    s.synchronize()
    assert s.query()
    assert b._lt_storage.value.buffer.is_ready()


def test_not_a_tpu_stream():
    with pytest.raises(TypeError, match="tpu stream"):
        torch.tpu.set_stream("not a stream")
    with pytest.raises(TypeError, match="tpu stream"):
        torch.tpu.Stream().wait_stream(object())


def test_interprocess_events_are_refused():
    with pytest.raises(RuntimeError, match="interprocess"):
        torch.tpu.Event(interprocess=True)


def test_the_timing_thread_ends_when_nothing_is_left():
    a = torch.randn(512, 512).to("tpu")
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    start.record()
    b = a @ a
    end.record()
    torch.tpu.synchronize()
    deadline = time.monotonic() + 30
    while streams._TIMER.thread is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert streams._TIMER.thread is None
    assert start.elapsed_time(end) >= 0
    del b


def test_torch_accelerator_streams_and_synchronize_are_torch_tpus():
    """(Note [Accelerator routing] in lazytpu.device.accelerator)"""
    start, end = torch.tpu.Event(enable_timing=True), torch.tpu.Event(enable_timing=True)
    x = torch.randn(128, 128).to("tpu")
    start.record()
    y = x @ x
    end.record()
    torch.accelerator.synchronize()
    assert start.query() and end.query() and start.elapsed_time(end) >= 0
    torch.accelerator.synchronize("tpu:0")
    torch.accelerator.synchronize(0)
    s = torch.tpu.Stream()
    torch.accelerator.set_stream(s)
    try:
        assert torch.accelerator.current_stream() == s == torch.tpu.current_stream()
    finally:
        torch.accelerator.set_stream(torch.tpu.default_stream())
    assert torch.accelerator.current_stream().stream_id == 0
    del y


def test_record_stream_records_nothing():
    """One queue (Note [One queue]): a buffer outlives the programs reading it anyway."""
    t = torch.arange(4.0).to("tpu")
    side = torch.tpu.Stream()
    with torch.tpu.stream(side):
        y = t * 2
    t.record_stream(side)
    del t
    torch.testing.assert_close(y.cpu(), torch.arange(4.0) * 2)
    with pytest.raises(TypeError, match="tpu stream"):
        y.record_stream(torch.Stream("cpu"))
