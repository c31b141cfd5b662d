"""``torch.tpu``'s memory functions, named as ``torch.cuda``'s.

The numbers are the runtime's (Note [Device memory] in lazytpu.runtime.memory):
the device's own statistics where PJRT has them, lazytpu's count of its
buffers otherwise (XLA:CPU). See docs/memory_and_streams.md.

``torch.accelerator.memory_allocated()`` and the other ``torch.accelerator``
memory functions run these (Note [Accelerator routing] in
lazytpu.device.accelerator).
"""

from __future__ import annotations

import collections
import os

import torch

from lazytpu import runtime
from lazytpu.runtime import memory as device_memory


def device_index(device=None) -> int:
    """The index of ``device``: an int, ``"tpu:1"``, a ``torch.device``, or
    None for the current device (``torch.tpu.current_device()``).

    Raises:
        ValueError: ``device`` is not a tpu device (as ``torch.cuda``'s
            functions raise for another device type).
        RuntimeError: the device does not exist.
    """
    if isinstance(device, int) and not isinstance(device, bool):
        return runtime.platform.checked_index(device)
    if device is None:
        return runtime.platform.current_index()
    parsed = torch.device(device)
    if parsed.type != "tpu":
        raise ValueError(f"Expected a tpu device, but got: {parsed}")
    return runtime.platform.checked_index(runtime.platform.index_or_current(parsed.index))


def _counts(device) -> dict:
    return device_memory.of(device_index(device)).snapshot()


def memory_allocated(device=None) -> int:
    """Bytes of device memory held by tensors' buffers now (values still
    pending in defer mode count once computed)."""
    return _counts(device)["current"]


def max_memory_allocated(device=None) -> int:
    """The largest ``memory_allocated`` since the start or the last
    ``reset_peak_memory_stats``, counting each program's temporaries while
    it runs (XLA's memory analysis of the program)."""
    return _counts(device)["peak"]


def reset_peak_memory_stats(device=None) -> None:
    """Make the peaks start again from the memory in use now."""
    device_memory.of(device_index(device)).reset_peak()


def reset_accumulated_memory_stats(device=None) -> None:
    """Set the totals (bytes and buffers allocated and freed) to zero."""
    device_memory.of(device_index(device)).reset_totals()


def _reserved(counts: dict) -> tuple[int, int]:
    """Reserved bytes now and at the peak: the device allocator's pool where
    PJRT reports one, else the allocated bytes (XLA:CPU has no caching allocator)."""
    stats = counts["device"] or {}
    for now, peak in (("pool_bytes", "peak_pool_bytes"), ("bytes_reserved", "peak_bytes_reserved")):
        if now in stats:
            return stats[now], max(stats.get(peak, 0), stats[now])
    return counts["current"], counts["peak"]


def memory_reserved(device=None) -> int:
    """Bytes the device's allocator holds: ``memory_allocated`` on XLA:CPU."""
    return _reserved(_counts(device))[0]


def max_memory_reserved(device=None) -> int:
    """The peak of ``memory_reserved`` (``max_memory_allocated`` on XLA:CPU)."""
    return _reserved(_counts(device))[1]


def memory_stats(device=None) -> collections.OrderedDict:
    """The memory statistics as ``torch.cuda.memory_stats`` names its main ones.

    ``allocated_bytes.all.{current,peak,allocated,freed}`` (bytes),
    ``allocation.all.{current,peak,allocated,freed}`` (buffers),
    ``active_bytes.all.*`` and ``active.all.*`` (the same: a buffer is
    active while held), ``requested_bytes.all.*`` (the same bytes: none are
    rounded up), ``reserved_bytes.all.{current,peak}``, and
    ``num_device_alloc``/``num_device_free``. Where PJRT reports statistics
    of its own, they follow as ``device.<name>``. Sorted by name, as torch's.
    """
    counts = _counts(device)
    reserved, reserved_peak = _reserved(counts)
    stats = {"num_device_alloc": counts["count_allocated"], "num_device_free": counts["count_freed"]}
    # bytes and buffers: torch's allocated/active pairs (a buffer is active while it is held)
    for prefixes, count in ((("allocated_bytes", "active_bytes"), ""), (("allocation", "active"), "count_")):
        for prefix in prefixes:
            stats |= {f"{prefix}.all.{k}": counts[count + k] for k in ("current", "peak", "allocated", "freed")}
    # requested: what tensors asked for, the same bytes (no rounding to a block size)
    stats |= {f"requested_bytes.all.{k}": counts[k] for k in ("current", "peak", "allocated", "freed")}
    stats |= {"reserved_bytes.all.current": reserved, "reserved_bytes.all.peak": reserved_peak}
    stats |= {f"device.{k}": v for k, v in (counts["device"] or {}).items()}
    return collections.OrderedDict(sorted(stats.items()))


def memory_stats_as_nested_dict(device=None) -> dict:
    """``memory_stats`` as ``torch.cuda``'s nested form: ``{"allocated_bytes": {"all": {"current": ...}}}``."""
    nested: dict = {}
    for name, value in memory_stats(device).items():
        *path, last = name.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return nested


def reset_max_memory_allocated(device=None) -> None:
    """``reset_peak_memory_stats``, by ``torch.cuda``'s older name."""
    reset_peak_memory_stats(device)


def _bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B  "
    scaled, unit = n / 1024, "KiB"
    for larger in ("MiB", "GiB"):
        if scaled >= 1024:
            scaled, unit = scaled / 1024, larger
    return f"{scaled:.2f} {unit}"


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A table of ``memory_stats``, as ``torch.cuda.memory_summary`` prints:
    current, peak, total allocated and total freed, in bytes and buffers.
    ``abbreviated`` is accepted; lazytpu has one pool, so the table is short."""
    stats = memory_stats(device)
    rows = [
        ("Allocated memory", "allocated_bytes", _bytes),
        ("Active memory", "active_bytes", _bytes),
        ("Requested memory", "requested_bytes", _bytes),
        ("Reserved memory", "reserved_bytes", _bytes),
        ("Allocations", "allocation", str),
        ("Active allocs", "active", str),
    ]
    columns = ("current", "peak", "allocated", "freed")
    line = "=" * 79
    out = [line, f" lazytpu memory summary, device tpu:{device_index(device)}".ljust(79), line]
    out.append(f" {'Metric':<22}| {'Cur Usage':>12} | {'Peak Usage':>12} | {'Tot Alloc':>12} | {'Tot Freed':>10}")
    out.append("-" * 79)
    for title, key, fmt in rows:
        cells = [stats.get(f"{key}.all.{c}") for c in columns]
        shown = [fmt(v) if v is not None else "" for v in cells]
        out.append(f" {title:<22}| {shown[0]:>12} | {shown[1]:>12} | {shown[2]:>12} | {shown[3]:>10}")
    out.append(line)
    return "\n".join(out) + "\n"


def mem_get_info(device=None) -> tuple[int, int]:
    """``(free, total)`` bytes of the device: from PJRT's ``bytes_limit``
    where it reports one; on XLA:CPU the host's available and physical memory."""
    stats = _counts(device)["device"] or {}
    if "bytes_limit" in stats:
        total = int(stats["bytes_limit"])
        return max(0, total - int(stats.get("bytes_in_use", 0))), total
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def empty_cache() -> None:
    """Release cached unused device memory: nothing to do, lazytpu keeps no
    cache of device memory (a buffer is freed when its last tensor dies), as
    XLA:CPU has none; on TPU and GPU PJRT's allocator keeps its pool."""
