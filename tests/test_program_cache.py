"""The in-memory program cache is bounded (Note [Program cache bound]):
least recently used programs are evicted, counted, and really released."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import lazytpu
from lazytpu import _config, runtime
from lazytpu.runtime import executor


def _run(n: int) -> None:
    """One program per distinct ``n``, checked against CPU torch."""
    expected = torch.arange(float(n)) * 3 - 1
    torch.testing.assert_close((torch.arange(float(n), device="tpu") * 3 - 1).cpu(), expected)


def _compiles(*sizes: int) -> int:
    lazytpu.metrics.reset()
    for n in sizes:
        _run(n)
    return lazytpu.metrics.snapshot()["programs_compiled"]


def _mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


@pytest.fixture
def bound():
    """A fresh program cache holding at most ``bound(n)`` programs."""
    runtime.clear_caches()
    stack = []

    def set_bound(n: int) -> None:
        stack.append(_config.PROGRAM_CACHE_SIZE.override(n))
        stack[-1].__enter__()

    yield set_bound
    for ctx in reversed(stack):
        ctx.__exit__(None, None, None)
    runtime.clear_caches()


def test_the_least_recently_used_program_is_evicted(bound):
    bound(3)
    assert _compiles(201, 202, 203) == 3
    assert _compiles(201) == 0  # a hit: 201 is now the most recently used
    assert _compiles(204) == 1  # evicts 202, the least recently used
    assert lazytpu.metrics.snapshot()["programs_evicted"] == 1
    assert _compiles(201, 203, 204) == 0
    with pytest.warns(UserWarning, match="was needed again"):
        assert _compiles(202) == 1
    info = runtime.cache_info()
    assert info["entries"] == 3 and info["evictions"] == 2 and info["size"] == 3


def test_a_workload_cycling_over_more_programs_than_the_bound_warns_once(bound):
    bound(2)
    with pytest.warns(UserWarning, match="LAZYTPU_PROGRAM_CACHE_SIZE=2") as caught:
        assert _compiles(211, 212, 213, 211, 212, 213, 211) == 7
    assert len([w for w in caught if "LAZYTPU_PROGRAM_CACHE_SIZE" in str(w.message)]) == 1
    assert lazytpu.metrics.snapshot()["programs_evicted"] == 5


def test_no_warning_for_a_stream_of_distinct_programs(bound, recwarn):
    bound(2)
    assert _compiles(*range(221, 227)) == 6
    assert not [w for w in recwarn if "LAZYTPU_PROGRAM_CACHE_SIZE" in str(w.message)]


def test_many_distinct_programs_run_at_flat_memory(bound):
    """Each compiled program holds memory mappings (the kernel allows 65,530)
    until it is dropped: past the bound they stay flat, and an evicted
    program is really released (nothing else keeps it alive), with the disk
    cache storing each one (conftest's cache directory)."""
    bound(4)
    _compiles(*range(301, 321))
    first = next(iter(executor._CACHE.entries.values()))[0]
    evicted = weakref.ref(first)
    del first
    gc.collect()
    before = _mappings()
    assert _compiles(*range(321, 381)) == 60
    gc.collect()
    assert evicted() is None
    assert _mappings() - before < 30  # unbounded: about 3 more per program for these small ones
    assert runtime.cache_info()["entries"] == 4
    assert lazytpu.metrics.snapshot()["programs_evicted"] == 60
