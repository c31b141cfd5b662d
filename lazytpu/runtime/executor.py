"""Compile programs once per canonical key and execute them."""

from __future__ import annotations

import threading
import time
import warnings

import jax
from jax.sharding import SingleDeviceSharding

from lazytpu import _caches, metrics
from lazytpu.runtime import persistent
from lazytpu.runtime.platform import device


class _ProgramCache:
    """In-memory cache of compiled executables, keyed by program key."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict = {}
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.hits = self.misses = 0


_CACHE = _ProgramCache()
_caches.register("programs", _CACHE.clear)


def _compile(key, fn, inputs, index: int, donate: tuple, on_compile):
    start = time.perf_counter()
    sharding = SingleDeviceSharding(device(index))
    with warnings.catch_warnings():
        # An input donated but not reusable by any output is simply freed: not news. Filtered
        # here, not globally, so that a caller's warning filters (pytest's, say) cannot undo it.
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        lowered = jax.jit(fn, out_shardings=sharding, donate_argnums=donate).lower(*inputs)
    if on_compile is not None:
        on_compile(lowered)
    signature = repr((jax.tree_util.tree_structure(inputs), [jax.typeof(x) for x in inputs], donate))
    compiled = persistent.load_or_compile(lowered, device(index), signature)
    metrics.add("compile_seconds", time.perf_counter() - start)
    metrics.add("programs_compiled")
    return compiled


def execute(
    key, make_fn, inputs: list, *, index: int = 0, blocking: bool = False, donate: tuple = (), on_compile=None
) -> tuple:
    """Run the program ``key`` on ``inputs``; compile it on a miss.

    Args:
        key: the canonical program key.
        make_fn: builds the JAX function on a cache miss.
        inputs: device buffers and Python scalars, in input order.
        index: device index.
        blocking: wait for the results (strict-blocking mode).
        donate: positions of input buffers nothing needs after this program
            (Note [Donation]); part of ``key``.
        on_compile: called with the ``jax.stages.Lowered`` on a cache miss
            (recompile explanations, dumps).
    """
    return run_program(key, lambda: _compile(key, make_fn(), inputs, index, donate, on_compile), inputs, blocking)


def run_program(key, compile_fn, args: list, blocking: bool = False):
    """Run the cached program ``key`` on ``args``, compiling it with
    ``compile_fn()`` on a miss (also the runner of ``distributed.ingraph``)."""
    compiled = _CACHE.entries.get(key)
    if compiled is None:
        metrics.add("cache_misses")
        compiled = compile_fn()
        with _CACHE.lock:
            _CACHE.misses += 1
            _CACHE.entries[key] = compiled
    else:
        metrics.add("cache_hits")
        with _CACHE.lock:
            _CACHE.hits += 1
    start = time.perf_counter()
    outputs = compiled(*args)
    if blocking:
        jax.block_until_ready(outputs)
    metrics.add("execute_seconds", time.perf_counter() - start)
    metrics.add("programs_executed")
    return outputs


def cache_info() -> dict:
    """The program caches: in-memory entries, hits and misses; disk entries
    and bytes."""
    disk_entries, disk_bytes = persistent.disk_usage()
    with _CACHE.lock:
        return {
            "entries": len(_CACHE.entries),
            "hits": _CACHE.hits,
            "misses": _CACHE.misses,
            "disk_entries": disk_entries,
            "bytes": disk_bytes,
        }


def clear_caches(disk: bool = False) -> None:
    """Clear every in-memory cache (compiled programs, meta-kernel memo, ...);
    with ``disk=True`` also delete the persistent compile cache."""
    _caches.clear_all()
    if disk:
        persistent.clear()
