"""Host <-> device copies, counted in the metrics."""

from __future__ import annotations

import jax
import numpy as np

from lazytpu import metrics
from lazytpu.runtime.platform import device


def from_host(array: np.ndarray, index: int = 0):
    """Copy a host array to the device (asynchronously)."""
    metrics.add("bytes_to_device", array.nbytes)
    return jax.device_put(array, device(index))


def to_host(buffer) -> np.ndarray:
    """Copy a device buffer to the host (blocks until it is computed)."""
    out = np.asarray(buffer)
    metrics.add("bytes_from_device", out.nbytes)
    return out
