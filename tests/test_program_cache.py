"""The in-memory program cache is bounded (Note [Program cache bound]):
least recently used programs are evicted, counted, and really released."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import lazytpu
from lazytpu import _caches, _config, runtime
from lazytpu.runtime import executor


def _run(n: int) -> None:
    """One program per distinct ``n``, checked against CPU torch (its input is
    a device buffer: a value made from numbers alone is read without a program
    after its first, Note [Constant reads] in lazytpu/engine_flush.py)."""
    x = torch.arange(float(n))
    torch.testing.assert_close((x.to("tpu") * 3 - 1).cpu(), x * 3 - 1)


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
    (warned,) = [w for w in caught if "LAZYTPU_PROGRAM_CACHE_SIZE" in str(w.message)]
    assert warned.filename == __file__, warned.filename  # the user's line (the read that compiled)
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


def test_a_memo_forgets_its_oldest_quarter_when_full():
    memo = _caches.Memo(8)
    for i in range(8):
        memo[i] = i
    memo[3] = "again"  # an existing key makes no room
    assert len(memo) == 8 and memo.forgotten == 0
    memo[8] = 8
    assert list(memo) == [2, 3, 4, 5, 6, 7, 8] and memo.forgotten == 2
    assert memo.setdefault(9, "new") == "new" and memo.setdefault(9, "other") == "new"
    memo.add("seen")
    assert "seen" in memo and len(memo) <= 8


@pytest.fixture
def small_memos():
    """Every recording memo limited to 16 entries (Note [Memo bound])."""
    runtime.clear_caches()
    memos = _caches.memos()
    limits = {name: memo.limit for name, memo in memos.items()}
    for memo in memos.values():
        memo.limit = 16
    yield memos
    for name, memo in memos.items():
        memo.limit = limits[name]
    runtime.clear_caches()


def _index_put_accumulate(n: int) -> None:
    """PyTorch's test_index_put_accumulate_duplicate_indices, one size."""
    indices = torch.empty(n, dtype=torch.double).uniform_(-1, 1).cumsum(0).long()
    base, values = torch.randn(int(indices.abs().max()) + 1), torch.randn(n)
    out = base.to("tpu").index_put((indices.to("tpu"),), values.to("tpu"), accumulate=True)
    torch.testing.assert_close(out.cpu(), base.index_put((indices,), values, accumulate=True))


def test_recording_memos_stay_bounded_over_many_shapes(bound, small_memos):
    """Each new shape adds entries to the recording memos (metas, plans,
    descriptors, op signatures): they stay within their limit, and a shape
    whose entries were forgotten is planned again and still right."""
    bound(4)
    torch.manual_seed(0)
    for n in range(1, 41):
        _index_put_accumulate(n)
    sizes = {name: len(memo) for name, memo in small_memos.items()}
    assert max(sizes.values()) <= 16, sizes
    for name in ("meta_memo", "record_plans", "tensor_descriptors", "op_signatures"):
        assert small_memos[name].forgotten > 0, name
    _index_put_accumulate(1)  # long forgotten
    assert runtime.cache_info()["entries"] == 4


def test_jax_caches_are_cleared_once_per_bound_evictions(bound, monkeypatch):
    """JAX's own per-shape caches go with every ``bound`` evicted programs
    (Note [Program cache bound]); a workload that evicts nothing keeps them."""
    import jax

    cleared = []
    monkeypatch.setattr(jax, "clear_caches", lambda: cleared.append(True))
    bound(3)
    _compiles(401, 402, 403, 401, 402)
    assert cleared == []
    assert _compiles(*range(404, 411)) == 7  # 7 evictions: two multiples of 3
    assert len(cleared) == 2
    torch.testing.assert_close((torch.arange(4.0, device="tpu") * 2).cpu(), torch.arange(4.0) * 2)


def test_mappings_past_half_the_kernels_limit_evict_the_older_half(bound, monkeypatch):
    """A program of a few hundred ops holds hundreds of mappings: past half of
    ``vm.max_map_count`` a compile evicts the least recently used half of the
    cache, whatever its bound (a graph-capped loop crashed in XLA at the limit)."""
    bound(100)
    assert _compiles(301, 302, 303, 304) == 4
    monkeypatch.setattr(executor, "_mappings", lambda: executor._mappings_limit())
    assert _compiles(305) == 1
    assert len(executor._CACHE.entries) == 2  # 305 and 304, the most recently used
    assert _compiles(304, 305) == 0
    monkeypatch.undo()
    assert _compiles(301) == 1 and len(executor._CACHE.entries) == 3
