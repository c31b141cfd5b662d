"""Host <-> device copies, counted in the metrics."""

from __future__ import annotations

import jax
import numpy as np

from lazytpu import metrics
from lazytpu.runtime import memory
from lazytpu.runtime.platform import device


def from_host(array: np.ndarray, index: int = 0):
    """Copy a host array to the device (asynchronously)."""
    metrics.add("bytes_to_device", array.nbytes)
    # On XLA:CPU device_put may wrap the host memory instead of copying it (even with
    # may_alias=False when the array views a torch tensor's memory), and a later in-place
    # write to the CPU tensor would then show through on the device. A private copy is the
    # device value's own memory.
    buffer = jax.device_put(np.array(array, copy=True), device(index))
    memory.of(index).track((buffer,), (array.nbytes,))  # Note [Device memory]
    return buffer


def to_host(buffer) -> np.ndarray:
    """Copy a device buffer to the host (blocks until it is computed). A failed one raises its
    program's error (Note [Failed buffers]): the buffer protocol aborted the process on XLA:CPU."""
    buffer.block_until_ready()
    out = np.asarray(buffer)
    metrics.add("bytes_from_device", out.nbytes)
    return out


# Note [Failed buffers]: a program can fail as it runs, after its launch
# returned (XLA allocates its buffers then: a tensor too large for the
# device's memory). Its outputs then hold the failure, and every read of one
# raises it. A value check computed there (its probe's read raised at every
# later host read) is dropped, and a device's random key computed there (every
# later random op read it, and failed) is replaced by the device's seed's key,
# with a warning: both ask ``failed`` (no wait: it looks only at computed values).


def failed(value) -> bool:
    """Whether ``value`` (a ``Data``) is computed and holds its program's failure."""
    buffer = getattr(value, "buffer", None)
    if buffer is None or buffer.is_deleted() or not buffer.is_ready():
        return False
    try:
        buffer.block_until_ready()
    except Exception:  # noqa: BLE001 - the failure its program ran into
        return True
    return False
