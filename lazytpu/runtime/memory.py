"""Bytes of device memory held by lazytpu's buffers, per device.

Note [Device memory]: the runtime makes every device buffer lazytpu holds
(a copy from the host, ``transfer.from_host``; a program's outputs,
``executor.run_compiled``), so it keeps the count: each buffer is tracked
with a weak reference that counts its bytes out when the last tensor (or
anything else) holding it lets go. A buffer donated to a program (Note
[Donation]) is counted out when the program is dispatched: XLA reuses its
memory for an output. A program's temporaries exist only while it runs, so
its dispatch raises the peak to the bytes live before it plus XLA's memory
analysis of the compiled program (``compiled.memory_analysis()``, once per
program): temporaries plus outputs, less the outputs that reuse donated
inputs. Counts follow dispatch, not completion (as a CUDA caching
allocator's do): a buffer counts from the moment it is handed out. A value
still pending (defer mode) has no buffer yet; it counts once computed. Not
counted: a program's temporaries that XLA:CPU's library fusions allocate
themselves (a matmul fused with what follows it: the analysis does not see
them), the temporaries of programs holding in-graph collectives (their
outputs are counted, ``distributed.ingraph``), and a copy from one tpu
device to another (a buffer ``jax.device_put`` makes outside this stage).
A buffer sharded over several devices counts its shard on each of them
(Note [SPMD programs] in lazytpu.runtime.executor); XLA's memory analysis
of an SPMD program is per device already.

Where the PJRT device reports memory statistics (``jax.Device.memory_stats()``:
TPU, GPU), current bytes are the device's own ``bytes_in_use`` (everything
on it, lazytpu's or not) and the peak the larger of the device's
``peak_bytes_in_use``, if it rose since the last reset (PJRT's peak cannot be
reset), and this count's. XLA:CPU reports none: there this count is the
answer, and reserved bytes equal allocated ones (no caching allocator).

The weak references' callbacks only append to a queue (they may fire inside
a locked section of the same thread, from garbage collection); the queue is
drained under the lock before the count is read or changed. Cost: about
0.7 µs per program output on XLA:CPU (its reference now, its count-out when
it dies), measured over programs of 200 outputs.
"""

from __future__ import annotations

import collections
import math
import threading
import weakref

import attrs

from lazytpu import _caches
from lazytpu.runtime.platform import device


class _Ref(weakref.ref):
    """A weak reference to a tracked buffer, with the bytes it counts."""

    __slots__ = ("key", "nbytes")


@attrs.frozen(slots=True)
class Footprint:
    """What a compiled program adds while it runs (Note [Device memory])."""

    transient: int  # temporaries + outputs - outputs that reuse donated inputs
    temp: int
    output_sizes: tuple[int, ...]


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def _shard_shape(out) -> tuple:
    sharding = getattr(out, "sharding", None)
    return out.shape if sharding is None else sharding.shard_shape(out.shape)


_FOOTPRINTS = weakref.WeakKeyDictionary()  # compiled program -> Footprint
_caches.register("program_footprints", _FOOTPRINTS.clear)


def footprint(compiled) -> Footprint:
    """XLA's memory analysis of ``compiled``, computed once per program."""
    found = _FOOTPRINTS.get(compiled)
    if found is None:
        import jax

        analysis = compiled.memory_analysis()
        # per device: the bytes of an output's shard (an SPMD program's, Note [SPMD programs])
        outputs = tuple(_nbytes(_shard_shape(o), o.dtype) for o in jax.tree_util.tree_leaves(compiled.out_info))
        if analysis is None:  # a platform without the analysis: the outputs at least
            temp, transient = 0, sum(outputs)
        else:
            temp = analysis.temp_size_in_bytes
            transient = temp + analysis.output_size_in_bytes - analysis.alias_size_in_bytes
        found = _FOOTPRINTS[compiled] = Footprint(transient, temp, outputs)
    return found


class DeviceMemory:
    """The buffer count of one device (Note [Device memory])."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.lock = threading.Lock()
        self.buffers: dict[int, _Ref] = {}  # id(buffer) -> its reference
        self.dead: collections.deque = collections.deque()  # references whose buffers died
        self.current = self.peak = 0
        self.allocated = self.freed = 0  # bytes, ever (since the last reset of the totals)
        self.count_allocated = self.count_freed = 0
        self.count_peak = 0
        self.device_peak_at_reset = 0
        self.largest_transient = 0  # the largest program footprint since the last reset

    def _died(self, ref: _Ref) -> None:
        self.dead.append(ref)  # only this: see the last paragraph of Note [Device memory]

    def _drain(self) -> None:
        dead, buffers = self.dead, self.buffers
        freed = count = 0
        while dead:
            ref = dead.popleft()
            if buffers.get(ref.key) is ref:
                del buffers[ref.key]
            if ref.nbytes:
                freed += ref.nbytes
                count += 1
        if count:
            self._free(freed, count)

    def _free(self, nbytes: int, count: int = 1) -> None:
        self.current -= nbytes
        self.freed += nbytes
        self.count_freed += count

    def _track(self, new, sizes) -> None:
        """Count the buffers ``new``, of ``sizes`` bytes (per-output cost: a
        weak reference and a dict entry; a flush of a step counts hundreds)."""
        buffers, died = self.buffers, self._died
        added = count = 0
        for buffer, nbytes in zip(new, sizes):
            key = id(buffer)
            old = buffers.get(key)
            if old is not None and old() is buffer:  # already counted (a program passing it through)
                continue
            ref = _Ref(buffer, died)
            ref.key = key
            ref.nbytes = nbytes
            buffers[key] = ref
            added += nbytes
            count += 1
        self.current += added
        self.allocated += added
        self.count_allocated += count

    def _release(self, buffer) -> None:
        ref = self.buffers.pop(id(buffer), None)
        if ref is not None and ref() is buffer and ref.nbytes:
            nbytes, ref.nbytes = ref.nbytes, 0  # its callback, if it still comes, counts nothing
            self._free(nbytes)

    def _raise_peak(self, transient: int = 0) -> None:
        self.peak = max(self.peak, self.current + transient)
        self.count_peak = max(self.count_peak, len(self.buffers))

    def track(self, buffers, sizes=None) -> None:
        """Count ``buffers`` (new device buffers; ``sizes``: their bytes, if known)."""
        with self.lock:
            self._drain()
            self._track(buffers, [b.nbytes for b in buffers] if sizes is None else sizes)
            self._raise_peak()

    def release(self, buffers) -> None:
        """Stop counting ``buffers``: inputs donated to a program run outside
        ``ran`` (an SPMD program of ``distributed.ingraph``, which donates the
        global arrays made over them: their weak references would keep them
        counted while anything holds the deleted Python arrays)."""
        with self.lock:
            self._drain()
            for buffer in buffers:
                self._release(buffer)

    def ran(self, compiled, args, donate, outputs) -> None:
        """A program was dispatched: its peak, its donated ``args`` out, its ``outputs`` in."""
        fp = footprint(compiled)
        sizes = fp.output_sizes if len(fp.output_sizes) == len(outputs) else None
        with self.lock:
            self._drain()
            self._raise_peak(fp.transient)
            self.largest_transient = max(self.largest_transient, fp.transient)
            for i in donate:
                self._release(args[i])
            self._track(outputs, [b.nbytes for b in outputs] if sizes is None else sizes)
            self._raise_peak()

    def device_stats(self) -> dict | None:
        """The PJRT device's own statistics, or None (XLA:CPU)."""
        return device(self.index).memory_stats() or None

    def snapshot(self) -> dict:
        """The counts, read now: ``current``, ``peak``, ``allocated``,
        ``freed`` (bytes), ``count_*`` (buffers), the device's statistics
        (``device``, or None) and the bytes ``current``/``peak`` come from
        (Note [Device memory])."""
        stats = self.device_stats()
        with self.lock:
            self._drain()
            own = {
                "current": self.current,
                "peak": self.peak,
                "allocated": self.allocated,
                "freed": self.freed,
                "count_current": len(self.buffers),
                "count_peak": self.count_peak,
                "count_allocated": self.count_allocated,
                "count_freed": self.count_freed,
                "largest_program": self.largest_transient,
                "device": stats,
            }
            reset_at = self.device_peak_at_reset
        if stats is not None and "bytes_in_use" in stats:
            own["current"] = stats["bytes_in_use"]
            device_peak = stats.get("peak_bytes_in_use", 0)
            own["peak"] = max(own["peak"], own["current"], device_peak if device_peak > reset_at else 0)
        return own

    def reset_peak(self) -> None:
        """Peaks start again from the bytes live now."""
        stats = self.device_stats()
        with self.lock:
            self._drain()
            self.peak, self.count_peak, self.largest_transient = self.current, len(self.buffers), 0
            self.device_peak_at_reset = (stats or {}).get("peak_bytes_in_use", 0)

    def reset_totals(self) -> None:
        """The totals (bytes and buffers allocated and freed, ever) start from zero."""
        with self.lock:
            self._drain()
            self.allocated = self.freed = self.count_allocated = self.count_freed = 0


_DEVICES: dict[int, DeviceMemory] = {}
_DEVICES_LOCK = threading.Lock()


def of(index: int) -> DeviceMemory:
    """The buffer count of device ``index`` (one owner per device)."""
    found = _DEVICES.get(index)
    if found is None:
        with _DEVICES_LOCK:
            found = _DEVICES.setdefault(index, DeviceMemory(index))
    return found
