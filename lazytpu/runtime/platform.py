"""Choose the PJRT device: ``LAZYTPU_PLATFORM`` or the best one present."""

from __future__ import annotations

import functools
import os

import jax

from lazytpu import _config

jax.config.update("jax_enable_x64", True)  # torch's int64/float64 must survive

_PREFERENCE = ("tpu", "gpu", "cpu")


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


class _ForkState:
    """Note [Fork]: PJRT clients do not survive ``fork``: a child forked after
    the parent initialized the device must not touch it (DataLoader workers
    that only handle CPU tensors are fine)."""

    initialized = False
    bad_fork = False


def _after_fork_in_child() -> None:
    if _ForkState.initialized:
        _ForkState.bad_fork = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def check_not_forked() -> None:
    if _ForkState.bad_fork:
        raise RuntimeError(
            "lazytpu: cannot use the tpu device in a forked subprocess after the parent process initialized it. "
            "Use the 'spawn' start method (torch.multiprocessing.set_start_method('spawn'), or "
            "DataLoader(..., multiprocessing_context='spawn')), or keep device work in the parent."
        )


def in_bad_fork() -> bool:
    return _ForkState.bad_fork


@functools.cache
def devices() -> tuple:
    """The PJRT devices lazytpu uses (all of one platform)."""
    check_not_forked()
    _ForkState.initialized = True
    present = _present()
    wanted = _config.PLATFORM.get()
    if wanted is not None:
        if wanted not in _PREFERENCE:
            raise RuntimeError(f"LAZYTPU_PLATFORM={wanted!r}: expected one of {', '.join(_PREFERENCE)}")
        if wanted not in present:
            raise RuntimeError(
                f"LAZYTPU_PLATFORM={wanted!r} but no {wanted} device is present; present: {', '.join(present)}"
            )
        return tuple(present[wanted])
    for name in _PREFERENCE:
        if name in present:
            return tuple(present[name])
    raise RuntimeError("no PJRT device found")


def device(index: int = 0):
    return devices()[index]


def platform_name() -> str:
    """The PJRT platform in use: ``tpu``, ``gpu`` or ``cpu``."""
    d = device(0)
    return "gpu" if d.platform in ("cuda", "rocm", "gpu") else d.platform
