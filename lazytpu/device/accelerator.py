"""``torch.accelerator`` on ``tpu``: its device index, stream, synchronization and memory
functions reach ``torch.tpu``'s.

Note [Accelerator routing]: torch 2.13's ``torch.accelerator`` functions call
``torch._C._accelerator_*`` bindings, which ask the device type's C++ device
guard (streams, ``synchronize``) and C++ allocator (memory statistics). A
Python backend can register neither: its guard (``torch._C._acc.DeviceGuard``)
overrides only the device type, and an allocator must be a C++
``c10::DeviceAllocator``. Unrouted, ``torch.accelerator.synchronize()``
raised "Backend doesn't support synchronizing all streams on device",
``memory_allocated()`` an internal assert, ``current_stream()`` always
returned the default stream, ``set_stream`` did nothing and the device
index functions (``set_device_index``, ``device_index``) neither set nor read
the current device (Note [Current device] in runtime/platform). ``register``
wraps those bindings in ``torch._C`` (looked up by name at every call, so
every caller of ``torch.accelerator`` sees the wrappers): while the current
accelerator is ``tpu`` they run ``torch.tpu``'s function of the same
meaning; otherwise (another accelerator current) torch's own binding runs.
"""

from __future__ import annotations

import functools

import torch

from lazytpu import _dtypes
from lazytpu.device import memory, streams, tpu


def _synchronize(index: int) -> None:
    tpu.synchronize(None if index < 0 else index)


def _device(index: int):
    return None if index < 0 else index


def _capability(index: int) -> dict:
    """``torch.accelerator.get_device_capability``: the dtypes a tensor of the device can have."""
    memory.device_index(_device(index))  # the error for a device that does not exist
    return {"supported_dtypes": _dtypes.supported()}


def _exchange(index: int) -> int:
    """Make ``index`` current (a negative one changes nothing); the device current before."""
    previous = tpu.current_device()
    if index >= 0:
        tpu.set_device(index)
    return previous


# binding name -> what it does on tpu (the arguments torch.accelerator passes it)
_ROUTES = {
    "_accelerator_synchronizeDevice": _synchronize,
    "_accelerator_getStream": lambda index: streams.current_stream(_device(index)),
    "_accelerator_setStream": streams.set_stream,
    "_accelerator_isAllocatorInitialized": lambda: True,
    "_accelerator_getDeviceStats": lambda index: memory.memory_stats(_device(index)),
    "_accelerator_resetAccumulatedStats": lambda index: memory.reset_accumulated_memory_stats(_device(index)),
    "_accelerator_resetPeakStats": lambda index: memory.reset_peak_memory_stats(_device(index)),
    "_accelerator_getMemoryInfo": lambda index: memory.mem_get_info(_device(index)),
    "_accelerator_emptyCache": memory.empty_cache,
    "_accelerator_emptyHostCache": lambda: None,  # no pinned host memory to release (it crashed: no host allocator)
    "_accelerator_getDeviceCapability": _capability,
    "_accelerator_getDeviceIndex": tpu.current_device,
    "_accelerator_setDeviceIndex": tpu.set_device,
    "_accelerator_exchangeDevice": _exchange,
    "_accelerator_maybeExchangeDevice": _exchange,
}


def _on_tpu() -> bool:
    current = torch._C._accelerator_getAccelerator()
    return current is not None and current.type == "tpu"


def _routed(ours, theirs):
    @functools.wraps(theirs)
    def call(*args):
        return ours(*args) if _on_tpu() else theirs(*args)

    call.lazytpu_routed = True
    return call


def register() -> None:
    """Idempotent: route the ``torch._C._accelerator_*`` bindings of ``_ROUTES`` (Note [Accelerator routing])."""
    for name, ours in _ROUTES.items():
        theirs = getattr(torch._C, name, None)
        if theirs is not None and not getattr(theirs, "lazytpu_routed", False):
            setattr(torch._C, name, _routed(ours, theirs))
