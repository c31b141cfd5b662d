"""``torch.tpu``: the device module of the ``tpu`` backend.

Names follow TorchTPU's ``torch.tpu`` so code written for it runs here.
"""

from __future__ import annotations

import contextlib
import sys
import types

import jax
import torch

from lazytpu import engine, engine_flush, runtime
from lazytpu.device.memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
)
from lazytpu.device.streams import Event, Stream, StreamContext, current_stream, default_stream, set_stream, stream
from lazytpu.engine import EagerMode
from lazytpu.frontend.generator import check_state

__all__ = [
    "EagerMode",
    "Event",
    "OutOfMemoryError",
    "Stream",
    "StreamContext",
    "current_device",
    "device",
    "current_stream",
    "default_stream",
    "device_count",
    "device_of",
    "eager_mode",  # noqa: F822 - a property of the module (see _TpuModule)
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_max_memory_allocated",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_eager_mode",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]


def is_available() -> bool:
    """Whether a PJRT device is present (always, on XLA:CPU at least)."""
    try:
        return len(runtime.platform.devices()) > 0
    except RuntimeError:
        return False


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    return runtime.platform.in_bad_fork()


def device_count() -> int:
    """Number of PJRT devices of the platform in use."""
    return len(runtime.platform.devices())


def current_device() -> int:
    """The calling thread's current device (Note [Current device] in runtime/platform)."""
    return runtime.platform.current_index()


def set_device(device) -> None:
    """Make ``device`` the calling thread's current device (a negative index changes nothing, as CUDA's)."""
    index = _index(device)
    if index >= 0:
        runtime.platform.set_current_index(runtime.platform.checked_index(index))


def _index(device) -> int:
    """``device``'s index (an int, a ``torch.device`` or a string); the current device's for None or ``"tpu"``."""
    if device is None or isinstance(device, int):
        return runtime.platform.index_or_current(device)
    return runtime.platform.index_or_current(torch.device(device).index)


def synchronize(device=None) -> None:
    """Run everything pending on ``device`` and wait for it."""
    ctx = engine.context(_index(device))
    ctx.flush_all("synchronize")
    with engine_flush.failures_as_torch_errors():
        jax.block_until_ready([b for lane in list(ctx.lanes.values()) for b in lane.graph.live_buffers()])
    ctx.read_value_checks()  # all computed now (Note [Value checks])


def manual_seed(seed: int) -> None:
    """Seed the current device's random state."""
    engine.context(current_device()).manual_seed(seed)


def manual_seed_all(seed: int) -> None:
    """Seed every device's random state (``torch.manual_seed`` calls this)."""
    for i in range(device_count()):
        engine.context(i).manual_seed(seed)


def _seeded(seeder) -> int:
    import random

    s = random.getrandbits(63)
    seeder(s)
    return s


def seed() -> int:
    """Seed the current device with a random number; returns it."""
    return _seeded(manual_seed)


def seed_all() -> int:
    """Seed every device with one random number (``torch.cuda.seed_all``); returns it."""
    return _seeded(manual_seed_all)


def initial_seed() -> int:
    return engine.context(current_device()).seed


def get_rng_state(device=None) -> torch.Tensor:
    return engine.context(_index(device)).get_rng_state()


def set_rng_state(state: torch.Tensor, device=None) -> None:
    check_state(state)
    engine.context(_index(device)).set_rng_state(state)


def get_rng_state_all() -> list[torch.Tensor]:
    """Every device's random state, by index."""
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    """Set the random state of device ``i`` to ``new_states[i]``."""
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def init() -> None:
    """Nothing to do: the device starts on first use (``torch.cuda.init``'s counterpart)."""


def get_device_name(device=None) -> str:
    """The PJRT device kind and platform, e.g. ``'cpu (PJRT cpu)'``."""
    d = runtime.device(_index(device))
    return f"{d.device_kind} (PJRT {runtime.platform_name()})"


def get_device_properties(device=None) -> types.SimpleNamespace:
    d = runtime.device(_index(device))
    return types.SimpleNamespace(
        name=get_device_name(device), platform=runtime.platform_name(), device_kind=d.device_kind, index=_index(device)
    )


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """True: every platform lazytpu runs on computes bfloat16 (code written for
    CUDA picks its autocast dtype with this)."""
    return True


OutOfMemoryError = torch.OutOfMemoryError  # what a program that does not fit raises, as torch.cuda's name


class device(contextlib.ContextDecorator):  # noqa: N801 (torch.cuda.device's name)
    """``torch.tpu.device(d)``: a context manager that makes ``d`` the current
    tpu device, as ``torch.cuda.device`` does (torch's storage ``.to(device=...)``
    enters it). ``d``: a ``torch.device``, a string or an index; None or a
    negative index changes nothing."""

    def __init__(self, device) -> None:
        if device is None or isinstance(device, int):
            self.index = -1 if device is None else device
        else:
            index = torch.device(device).index
            self.index = current_device() if index is None else index
        self.previous = -1

    def __enter__(self):
        self.previous = current_device()
        if self.index >= 0 and self.index != self.previous:
            set_device(self.index)
        return self

    def __exit__(self, *exc) -> bool:
        if self.index >= 0 and self.index != self.previous:
            set_device(self.previous)
        return False


class device_of(device):  # noqa: N801 (torch.cuda.device_of's name)
    """``torch.tpu.device_of(t)``: makes ``t``'s device current for the block;
    a tensor of another device type changes nothing, as ``torch.cuda.device_of``."""

    def __init__(self, obj) -> None:
        super().__init__(obj.get_device() if obj.device.type == "tpu" else -1)


class set_eager_mode:  # noqa: N801 - named as TorchTPU's function
    """Set the eager mode; as a context manager, only for the block.

    Like ``torch.set_grad_enabled``: ``torch.tpu.set_eager_mode("strict")``
    switches now; ``with torch.tpu.set_eager_mode(...):`` switches back after.

    Example:
        >>> with torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        ...     y = x + 1  # runs now, as its own program
    """

    def __init__(self, mode) -> None:
        self.previous = engine.MODE.current
        engine.MODE.set(mode)

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc) -> None:
        engine.MODE.set(self.previous)


class _TpuModule(types.ModuleType):
    """Gives the module a settable ``eager_mode`` property."""

    @property
    def eager_mode(self) -> EagerMode:
        return engine.MODE.current

    @eager_mode.setter
    def eager_mode(self, mode) -> None:
        engine.MODE.set(mode)


sys.modules[__name__].__class__ = _TpuModule
