"""``torch.tpu`` streams and events, named as ``torch.cuda``'s.

Note [One queue]: a PJRT device runs lazytpu's programs as one in-order
queue, and a program waits for the buffers it reads, so there is nothing for
several streams to overlap and nothing for a stream to wait for: every
``Stream`` is a name for that one queue, and ``wait_stream`` and
``wait_event`` change nothing (the work that follows them runs after the
work before them anyway). What the names do keep is their bookkeeping:
distinct ids, the current stream per thread and device (as CUDA's, per
thread), ``torch.tpu.stream(s)`` blocks, so code written for CUDA streams
(FSDP2's, ``torch.distributed.checkpoint``'s) runs unchanged.

An ``Event`` is the point of the queue where it was recorded, and is
complete once the work recorded before it has run (``query`` asks
``jax.Array.is_ready`` of the buffers it waits for, ``synchronize`` waits).
Recording one dispatches nothing (Note [Deferred events]); a timing event
(``enable_timing=True``) does dispatch what is pending (a sync point, reason
``event``), since its time is that of a point between programs. A timing event takes its
time when its buffers are complete: at once if they already are, else from a
helper thread that waits for them (only for ``enable_timing=True`` events
with work outstanding; it exits when none is left), or from a ``query`` or
``synchronize`` that finds them complete first. So ``elapsed_time`` also
works after ``torch.tpu.synchronize()``, as on CUDA.

Note [Deferred events]: FSDP2 records an event after every layer's
all-gather and reduce-scatter, and makes its streams wait for them, which
changes nothing on one queue (Note [One queue]). If recording dispatched what
is pending, a training step would be cut into a program per layer and
direction; instead an event recorded while work is pending remembers only
that some is (``_deferred``), and the step stays one program (or its usual
segments, Note [Step segments] in lazytpu.engine). Its ``query`` and
``synchronize``, which must know whether that work has run, dispatch what is
pending then (reason ``event``) and wait for the device's buffers not yet
computed: in defer mode the work recorded before the event and any recorded
after it, up to the query, are fused into the same programs, so they complete
together, and the answer is the one a queue of these programs gives. An
event recorded with nothing pending waits for the buffers still computing, as
before.

``torch.accelerator.synchronize()``, ``current_stream()`` and
``set_stream(s)`` run ``torch.tpu``'s (Note [Accelerator routing] in
lazytpu.device.accelerator). ``torch.Stream.wait_event`` and ``wait_stream``
of torch's own stream accept these events and streams and do nothing, which
is right for one queue.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import os
import threading
import time

import jax
import torch

from lazytpu import engine, runtime
from lazytpu.device.memory import device_index
from lazytpu.frontend.record import handles
from lazytpu.ir import Data

_TPU = int(torch._C._autograd.DeviceType.PrivateUse1)  # the device type code of tpu streams
_IDS = itertools.count(1)  # new streams' ids; 0 is the default stream's
_EVENT_IDS = itertools.count(1)  # recorded events' ids


def _tpu_sync(index: int) -> None:
    torch.get_device_module("tpu").synchronize(index)


class Stream(torch.Stream):
    """A stream of a ``tpu`` device: a name for its one in-order queue (Note [One queue]).

    Args:
        device: the device (default: the current one).
        priority: accepted and ignored (one queue has no priorities).
    """

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs:  # an existing stream, by its ids
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, stream_id=next(_IDS), device_index=device_index(device), device_type=_TPU)

    def wait_event(self, event) -> None:
        """Make later work on this stream wait for ``event``: it does (Note [One queue])."""
        event.wait(self)

    def wait_stream(self, stream) -> None:
        """Make later work on this stream wait for ``stream``'s: it does (Note [One queue])."""
        _check_tpu(stream)

    def record_event(self, event: Event | None = None) -> Event:
        """Record ``event`` (a new one if None) on this stream; returns it."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        """Whether all work on the device is done; dispatches what is pending."""
        ctx = engine.context(self.device_index)
        ctx.flush_all("event")
        return all(b.is_ready() for b in _device_buffers(ctx))

    def synchronize(self) -> None:
        """Wait for all work on the device (``torch.tpu.synchronize``)."""
        _tpu_sync(self.device_index)

    def __enter__(self) -> Stream:
        context = StreamContext(self)
        self.__dict__.setdefault("_contexts", []).append(context)
        context.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._contexts.pop().__exit__(*exc)

    def __repr__(self) -> str:
        return f"torch.tpu.Stream(device=tpu:{self.device_index} stream_id={self.stream_id})"


@handles(torch.ops.aten.record_stream.default)
def record_stream(func, args, kwargs) -> None:
    """``t.record_stream(s)``: a buffer stays alive while a program that reads
    it runs, and there is one queue (Note [One queue]): nothing to record."""
    _check_tpu(args[1])


def _check_tpu(stream) -> None:
    if not isinstance(stream, torch.Stream) or stream.device_type != _TPU:
        raise TypeError(f"expected a tpu stream, got {stream!r}")


def _as_tpu_stream(stream) -> Stream:
    _check_tpu(stream)
    if isinstance(stream, Stream):
        return stream
    return Stream(stream_id=stream.stream_id, device_index=stream.device_index, device_type=_TPU)


def default_stream(device=None) -> Stream:
    """The default stream of ``device`` (id 0, as ``torch.accelerator.current_stream()``'s)."""
    return Stream(stream_id=0, device_index=device_index(device), device_type=_TPU)


class _CurrentStreams(threading.local):
    """Each thread's current stream per device (CUDA's current stream is per thread)."""

    def __init__(self) -> None:
        self.streams: dict[int, Stream] = {}


_CURRENT = _CurrentStreams()


def current_stream(device=None) -> Stream:
    """The calling thread's current stream on ``device`` (the default stream unless set)."""
    index = device_index(device)
    found = _CURRENT.streams.get(index)
    return default_stream(index) if found is None else found


def set_stream(stream) -> None:
    """Make ``stream`` the calling thread's current stream on its device, and its device the current
    device, as ``torch.cuda.set_stream`` (None: no change)."""
    if stream is None:
        return
    stream = _as_tpu_stream(stream)
    _CURRENT.streams[stream.device_index] = stream
    runtime.platform.set_current_index(stream.device_index)


class StreamContext:
    """Make ``stream`` current on its device for a ``with`` block (None: no change)."""

    def __init__(self, stream) -> None:
        self.stream = None if stream is None else _as_tpu_stream(stream)
        self.previous: Stream | None = None
        self.device = 0

    def __enter__(self) -> Stream | None:
        if self.stream is not None:
            self.device = runtime.platform.current_index()
            self.previous = current_stream(self.stream.device_index)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc) -> None:
        if self.stream is not None:
            set_stream(self.previous)
            runtime.platform.set_current_index(self.device)  # the device current before, as CUDA's


def stream(stream) -> StreamContext:
    """``with torch.tpu.stream(s):`` runs the block with ``s`` current (``torch.cuda.stream``)."""
    return StreamContext(stream)


def _device_buffers(ctx) -> list:
    """The buffers the device holds for the live values of its lanes, and its random state."""
    buffers = [b for lane in list(ctx.lanes.values()) for b in lane.graph.live_buffers()]
    if type(ctx.random.value) is Data:
        buffers.append(ctx.random.value.buffer)
    return buffers


def _pending(ctx) -> bool:
    """Whether some lane of the device has work recorded and not dispatched."""
    return any(lane.graph.pending for lane in list(ctx.lanes.values()))


def _outstanding(buffers: list, index: int) -> list:
    """The ``buffers`` not computed yet. One donated to a later program since
    (deleted) cannot be asked: what the device holds now stands for it (it
    comes later in the queue)."""
    if any(b.is_deleted() for b in buffers):
        buffers = [b for b in buffers if not b.is_deleted()] + _device_buffers(engine.context(index))
    return [b for b in buffers if not b.is_deleted() and not b.is_ready()]


class Event(torch.Event):
    """A point of a ``tpu`` device's queue (Note [One queue]).

    Args:
        enable_timing: keep the time the work before it completed (``elapsed_time``).
        blocking, interprocess: accepted as ``torch.cuda.Event``'s; ``synchronize``
            always waits, and interprocess events are not supported.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise RuntimeError("tpu events do not support interprocess=True")
        return super().__new__(cls, device="tpu", enable_timing=enable_timing, blocking=blocking)

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self._timing = enable_timing
        self._index: int | None = None  # the device it was recorded on
        self._waiting: list = []  # the buffers it waits for
        self._time: float | None = None  # time.perf_counter() when they were complete
        self._deferred = False  # work was pending at record, not dispatched yet (Note [Deferred events])
        self._lock = threading.Lock()
        self._id = 0

    def record(self, stream=None) -> None:
        """Make this event complete when the work recorded so far on
        ``stream``'s device (default: the current stream) has run. A timing
        event dispatches that work now (Note [Deferred events])."""
        stream = current_stream() if stream is None else _as_tpu_stream(stream)
        ctx = engine.context(stream.device_index)
        self._id = self._id or next(_EVENT_IDS)
        if not self._timing and _pending(ctx):
            with self._lock:
                self._index, self._waiting, self._time, self._deferred = stream.device_index, [], None, True
            return
        self._dispatched(ctx, stream.device_index)

    def _dispatched(self, ctx, index: int) -> None:
        """Dispatch what is pending on the device; wait for what is computing."""
        ctx.flush_all("event")
        waiting = [b for b in _device_buffers(ctx) if not b.is_ready()]
        with self._lock:
            self._index, self._waiting, self._time, self._deferred = index, waiting, None, False
        if not waiting:
            self._complete(time.perf_counter())
        elif self._timing:
            _TIMER.watch(self, waiting)

    def _complete(self, when: float) -> None:
        with self._lock:
            self._waiting = []
            if self._time is None:
                self._time = when

    def query(self) -> bool:
        """Whether the work recorded before this event has run (True if never recorded)."""
        if self._deferred:
            self._dispatched(engine.context(self._index), self._index)
        if self._index is None or not self._waiting:
            return True
        left = _outstanding(self._waiting, self._index)
        if left:
            self._waiting = left
            return False
        self._complete(time.perf_counter())
        return True

    def synchronize(self) -> None:
        """Wait until the work recorded before this event has run."""
        if self._index is None:
            return
        if self._deferred:
            self._dispatched(engine.context(self._index), self._index)
        jax.block_until_ready(_outstanding(self._waiting, self._index))
        self._complete(time.perf_counter())

    def wait(self, stream=None) -> None:
        """Make later work on ``stream`` wait for this event: it does (Note [One queue])."""
        if stream is not None:
            _check_tpu(stream)

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds from this event's completion to ``end_event``'s.

        Raises:
            ValueError: an event was made without ``enable_timing=True``, or was not recorded (CUDA's types).
            RuntimeError: an event has not completed.
        """
        if not (self._timing and getattr(end_event, "_timing", False)):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._index is None or end_event._index is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if not (self.query() and end_event.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0

    @property
    def device(self) -> torch.device:
        """The device it was last recorded on (``tpu`` before it is recorded)."""
        return torch.device("tpu") if self._index is None else torch.device("tpu", self._index)

    @property
    def event_id(self) -> int:
        """A number of its own once recorded (0 before), as ``torch.Event``'s."""
        return self._id

    def __repr__(self) -> str:
        where = "not recorded" if self._index is None else f"tpu:{self._index}"
        return f"torch.tpu.Event({where}, enable_timing={self._timing})"


class _Timer:
    """Takes the times of timing events with work outstanding, on a helper
    thread that lives while there is some (Note [One queue])."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.queue: collections.deque = collections.deque()
        self.thread: threading.Thread | None = None

    def watch(self, event: Event, buffers: list) -> None:
        with self.lock:
            self.queue.append((event, buffers))
            if self.thread is not None:
                return
            self.thread = threading.Thread(target=self._run, name="lazytpu-event-times", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    self.thread = None
                    return
                event, buffers = self.queue.popleft()
            try:
                jax.block_until_ready(_outstanding(buffers, event._index))
            except Exception:  # noqa: BLE001 - a failed program: its error is raised where it is read
                pass
            event._complete(time.perf_counter())

    def drain(self, timeout: float = 60.0) -> None:
        """Wait for the helper thread (at exit: it must not wait on the device while it shuts down)."""
        thread = self.thread
        if thread is not None:
            thread.join(timeout)

    def forget(self) -> None:
        """In a forked child: the parent's thread is not there."""
        self.lock = threading.Lock()
        self.queue.clear()
        self.thread = None


_TIMER = _Timer()
atexit.register(_TIMER.drain)
os.register_at_fork(after_in_child=_TIMER.forget)
