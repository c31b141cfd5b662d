"""Choose the PJRT device: ``LAZYTPU_PLATFORM`` or the best one present."""

from __future__ import annotations

import functools
import glob
import os
import threading
import warnings

import jax

from lazytpu import _config

jax.config.update("jax_enable_x64", True)  # torch's int64/float64 must survive

_PREFERENCE = _config.PLATFORMS
_JAX_ALIASES = {"cuda": "gpu", "rocm": "gpu", "oneapi": "gpu"}  # JAX_PLATFORMS names of lazytpu's gpu


def _present() -> dict[str, list]:
    found = {}
    for name in _PREFERENCE:
        try:
            devs = jax.local_devices(backend=name)  # this process's devices (multi-process jobs)
        except RuntimeError:
            continue
        if devs:
            found[name] = devs
    return found


class ForkState:
    """Note [Fork]: PJRT clients do not survive ``fork``: a child forked after
    the parent initialized the device must not touch it (DataLoader workers
    that only handle CPU tensors are fine). A child that does gets
    ``check_not_forked``'s error; JAX's own warning at every fork of
    ``multiprocessing`` ("likely lead to a deadlock", for a child that runs
    JAX) is filtered, so that DataLoader workers fork as quietly as under CUDA."""

    initialized = False
    bad_fork = False


def _after_fork_in_child() -> None:
    if ForkState.initialized:
        ForkState.bad_fork = True


os.register_at_fork(after_in_child=_after_fork_in_child)
warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning, r"multiprocessing\.")


def check_not_forked() -> None:
    if ForkState.bad_fork:
        raise RuntimeError(
            "lazytpu: cannot use the tpu device in a forked subprocess after the parent process initialized it. "
            "Use the 'spawn' start method (torch.multiprocessing.set_start_method('spawn'), or "
            "DataLoader(..., multiprocessing_context='spawn')), or keep device work in the parent."
        )


def in_bad_fork() -> bool:
    return ForkState.bad_fork


def _absent(wanted: str, present) -> RuntimeError:
    return RuntimeError(
        f"{_config.PLATFORM.env}={wanted!r} but no {wanted} device is present; present: {', '.join(present) or 'none'}"
    )


@functools.cache
def devices() -> tuple:
    """The PJRT devices lazytpu uses (all of one platform)."""
    check_not_forked()
    ForkState.initialized = True
    present = _present()
    wanted = _config.PLATFORM.get()
    if wanted is not None:
        if wanted not in present:
            raise _absent(wanted, present)
        return tuple(present[wanted])
    for name in _PREFERENCE:
        if name in present:
            return tuple(present[name])
    raise RuntimeError("no PJRT device found")


# Note [Platform at import]: a platform named by LAZYTPU_PLATFORM that this
# machine cannot have is an error at ``import lazytpu``, not at the first
# sync. Without starting a PJRT client: starting one at import would hold
# the chips (a spawned DataLoader worker that imports the script would then
# fail to get them) and would come before ``init_process_group`` must start
# JAX's multi-process runtime. So the check reads what JAX itself reads to
# suggest a missing plugin (PCI devices, device files) and JAX_PLATFORMS;
# a platform whose hardware is there but whose client fails to start is
# reported when the device is first used.


def _hardware_visible() -> dict[str, bool]:
    try:
        from jax._src import hardware_utils as hw

        tpu = hw.num_available_tpu_chips_and_device_id()[0] > 0 or bool(glob.glob("/dev/accel*"))
        gpu = hw.has_visible_nvidia_gpu() or hw.num_available_amd_gpus(stop_at=1) != 0
    except Exception:  # JAX moved its probes: judge nothing at import
        return dict.fromkeys(_PREFERENCE, True)
    return {"tpu": tpu, "gpu": gpu, "cpu": True}


def possible_platforms() -> tuple[str, ...]:
    """The platforms this process may have, best first (Note [Platform at import])."""
    allowed = jax.config.jax_platforms
    names = {_JAX_ALIASES.get(p.strip(), p.strip()) for p in allowed.split(",")} if allowed else set(_PREFERENCE)
    visible = _hardware_visible()
    return tuple(n for n in _PREFERENCE if n in names and visible[n])


def check_requested_platform() -> None:
    """Raise at import when LAZYTPU_PLATFORM names a platform this machine lacks."""
    wanted = _config.PLATFORM.get()
    if wanted is not None:
        possible = possible_platforms()
        if wanted not in possible:
            raise _absent(wanted, possible)


def checked_index(index: int) -> int:
    """``index``, or a ``RuntimeError`` if the platform has no such device (CUDA raises one too)."""
    count = len(devices())
    if not 0 <= index < count:
        raise RuntimeError(f"tpu:{index} does not exist: device_count() is {count}")
    return index


def device(index: int = 0):
    return devices()[checked_index(index)]


def platform_name() -> str:
    """The PJRT platform in use: ``tpu``, ``gpu`` or ``cpu``."""
    d = device(0)
    return "gpu" if d.platform in ("cuda", "rocm", "gpu") else d.platform


# Note [Current device]: as CUDA's, the current device is a host thread's
# own (a thread starts on device 0), and a device named without an index
# (``"tpu"``: ``torch.ones(2, device="tpu")``, ``with torch.device("tpu")``,
# ``torch.tpu.synchronize()``) is the current one. ``torch.tpu.set_device``,
# ``torch.tpu.device(i)``, the ``torch.accelerator`` device index functions
# and making a stream of another device current set it. Not followed: a copy
# from the host (``x.to("tpu")``, ``torch.tensor(data, device="tpu")``), whose
# device torch's C++ resolves through the Python device guard, always tpu:0
# (docs/limitations.md).
class _Current(threading.local):
    index = 0


_CURRENT = _Current()


def current_index() -> int:
    """The calling thread's current device (Note [Current device])."""
    return _CURRENT.index


def set_current_index(index: int) -> None:
    _CURRENT.index = index


def index_or_current(index: int | None) -> int:
    """A device's index, or the current device's when it has none (``torch.device("tpu").index``)."""
    return _CURRENT.index if index is None else index
