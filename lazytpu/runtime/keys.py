"""PRNG keys on the device (Note [Random state] in lazytpu.ir.graph): made
from a seed, and read and written as torch's RNG state, their bytes."""

from __future__ import annotations

import jax
import numpy as np

from lazytpu.ir.node import RNG_AVAL, Data
from lazytpu.runtime.transfer import from_host, to_host

# A key's two uint32 words, as torch's RNG state gives them: uint8 bytes.
STATE_BYTES = 8


def seed_key(seed: int, index: int) -> Data:
    """The key of ``seed`` on device ``index``."""
    seed &= 0xFFFFFFFFFFFFFFFF  # torch's seeds are 64-bit unsigned; JAX takes them signed
    key = np.asarray(jax.random.key_data(jax.random.PRNGKey(seed - (1 << 64) if seed >= 1 << 63 else seed)))
    return Data(from_host(key.astype(np.uint32), index), RNG_AVAL)


def key_bytes(value: Data) -> np.ndarray:
    """A computed key's bytes (uint8)."""
    return np.asarray(to_host(value.buffer)).view(np.uint8).copy()


def bytes_key(state: np.ndarray, index: int) -> Data:
    """The key of ``key_bytes``'s ``state`` on device ``index``."""
    return Data(from_host(np.ascontiguousarray(state).view(np.uint32).reshape(2), index), RNG_AVAL)
