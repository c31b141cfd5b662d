"""``torch.tpu``'s memory functions (Note [Device memory] in lazytpu/runtime/memory.py).

XLA:CPU reports no PJRT memory statistics, so these numbers are lazytpu's own
count of its device buffers; the last tests give the count a platform's
statistics (a stand-in dict) to check what is taken from them.
"""

from __future__ import annotations

import collections
import gc

import pytest
import torch

from lazytpu.runtime import memory as runtime_memory


def _settled() -> int:
    """Bytes allocated once everything pending has run and dead tensors are gone."""
    torch.tpu.synchronize()
    gc.collect()
    return torch.tpu.memory_allocated()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_a_tensor_counts_its_bytes_once_computed_and_until_freed(dtype):
    before = _settled()
    x = torch.ones(64, 48, dtype=dtype, device="tpu")
    assert torch.tpu.memory_allocated() == before  # pending in defer mode: no buffer yet
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == before + x.numel() * x.element_size()
    del x
    gc.collect()
    assert torch.tpu.memory_allocated() == before


def test_a_copy_from_the_host_counts_at_once():
    before = _settled()
    x = torch.randn(100, 30, dtype=torch.float64).to("tpu")
    assert torch.tpu.memory_allocated() == before + 100 * 30 * 8
    del x
    gc.collect()
    assert torch.tpu.memory_allocated() == before


def test_strict_mode_counts_each_op_as_it_runs():
    before = _settled()
    with torch.tpu.set_eager_mode("strict"):
        x = torch.ones(1000, device="tpu")
        assert torch.tpu.memory_allocated() == before + 4000
        y = x * 2
        assert torch.tpu.memory_allocated() == before + 8000
    del x, y


def _with_temporaries(x):
    """A scalar whose program holds x-sized temporaries: the product and its
    cumulative sum (XLA's memory analysis sees them; it does not see scratch
    memory inside one of XLA:CPU's library fusions, as of a matmul and a tanh:
    docs/memory_and_streams.md)."""
    return ((x @ x).cumsum(0) * x).sum()


def test_peak_covers_a_programs_temporaries():
    x = torch.randn(256, 256).to("tpu")
    before = _settled()
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == before
    total = _with_temporaries(x)
    torch.tpu.synchronize()
    assert torch.tpu.memory_allocated() == before + 4  # only the float32 result is left
    assert torch.tpu.max_memory_allocated() >= before + 256 * 256 * 4
    del total


def test_reset_makes_the_peak_start_again():
    x = torch.randn(512, 512).to("tpu")
    torch.tpu.synchronize()
    big = _with_temporaries(x)
    torch.tpu.synchronize()
    assert torch.tpu.max_memory_allocated() >= torch.tpu.memory_allocated() + 512 * 512 * 4
    torch.tpu.reset_peak_memory_stats()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()
    small = x[0].sum()
    torch.tpu.synchronize()
    assert torch.tpu.max_memory_allocated() < torch.tpu.memory_allocated() + 512 * 512 * 4
    del big, small


def test_a_donated_buffer_is_not_counted_twice():
    x = torch.zeros(4096, device="tpu")
    steady = _settled()
    torch.tpu.reset_peak_memory_stats()
    for _ in range(3):
        x.add_(1)  # its old buffer is donated to the program that writes the new one
        torch.tpu.synchronize()
        assert torch.tpu.memory_allocated() == steady
    assert torch.tpu.max_memory_allocated() <= steady + 4096 * 4
    assert x.sum().item() == 3 * 4096


def test_memory_stats_has_cudas_main_keys():
    x = torch.randn(64, 64).to("tpu")
    (x + 1).sum().item()
    stats = torch.tpu.memory_stats()
    assert isinstance(stats, collections.OrderedDict) and list(stats) == sorted(stats)
    for prefix in ("allocated_bytes", "active_bytes", "requested_bytes", "allocation", "active", "reserved_bytes"):
        for kind in ("current", "peak"):
            assert f"{prefix}.all.{kind}" in stats
    for prefix in ("allocated_bytes", "allocation"):
        for kind in ("allocated", "freed"):
            assert f"{prefix}.all.{kind}" in stats
    assert all(isinstance(v, int) and v >= 0 for v in stats.values())
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    assert stats["allocated_bytes.all.peak"] == torch.tpu.max_memory_allocated()
    assert stats["allocation.all.current"] >= 1


def test_cudas_other_memory_functions():
    # code written for CUDA prints the summary, reads the nested stats, resets by the older name
    x = torch.randn(256).to("tpu")
    stats = torch.tpu.memory_stats()
    assert stats["requested_bytes.all.current"] == stats["allocated_bytes.all.current"] >= x.nbytes
    nested = torch.tpu.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == stats["allocated_bytes.all.current"]
    summary = torch.tpu.memory_summary()
    assert "Allocated memory" in summary and "Peak Usage" in summary and "tpu:0" in summary
    (x * 2).sum().item()
    torch.tpu.reset_max_memory_allocated()
    assert torch.tpu.max_memory_allocated() == torch.tpu.memory_allocated()
    assert torch.tpu.OutOfMemoryError is torch.OutOfMemoryError and torch.tpu.is_bf16_supported()
    with torch.tpu.device_of(x):
        assert torch.tpu.current_device() == 0
    with torch.tpu.device_of(torch.ones(1)):  # a CPU tensor changes nothing
        assert torch.tpu.current_device() == 0


def test_totals_reset():
    torch.tpu.reset_accumulated_memory_stats()
    stats = torch.tpu.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == stats["allocated_bytes.all.freed"] == 0
    x = torch.ones(10, device="tpu")
    torch.tpu.synchronize()
    assert torch.tpu.memory_stats()["allocated_bytes.all.allocated"] == 40
    del x


def test_reserved_is_allocated_on_xla_cpu():
    assert torch.tpu.memory_reserved() == torch.tpu.memory_allocated()
    assert torch.tpu.max_memory_reserved() == torch.tpu.max_memory_allocated()


def test_mem_get_info_returns_free_and_total():
    free, total = torch.tpu.mem_get_info()
    assert type(free) is int and type(total) is int
    assert 0 <= free <= total


def test_empty_cache_keeps_live_memory():
    x = torch.ones(100, device="tpu")
    held = _settled()
    torch.tpu.empty_cache()
    assert torch.tpu.memory_allocated() == held
    del x


@pytest.mark.parametrize("device", [None, 0, "tpu", "tpu:0", torch.device("tpu"), torch.device("tpu", 0)])
def test_device_forms(device):
    assert torch.tpu.memory_allocated(device) == torch.tpu.memory_allocated()
    torch.tpu.reset_peak_memory_stats(device)
    assert torch.tpu.max_memory_allocated(device) == torch.tpu.memory_allocated()


def test_another_device_type_is_a_value_error():
    with pytest.raises(ValueError, match="Expected a tpu device"):
        torch.tpu.memory_allocated("cpu")


def test_torch_accelerator_memory_functions_are_torch_tpus():
    """(Note [Accelerator routing] in lazytpu.device.accelerator)"""
    x = torch.randn(64, 64).to("tpu")
    (x @ x).cpu()
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated() > 0
    assert torch.accelerator.memory_allocated("tpu:0") == torch.accelerator.memory_allocated(0)
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.tpu.max_memory_allocated()
    y = torch.randn(128, 128).to("tpu")
    y.cpu()
    assert torch.accelerator.memory_allocated() == torch.tpu.memory_allocated()
    assert torch.accelerator.max_memory_allocated() >= torch.accelerator.memory_allocated()
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.tpu.memory_allocated()
    free, total = torch.accelerator.get_memory_info()
    assert 0 <= free <= total
    torch.accelerator.empty_cache()
    torch.accelerator.empty_host_cache()  # nothing to release (it crashed the process: no host allocator)
    torch.accelerator.reset_accumulated_memory_stats()
    assert {torch.float32, torch.bfloat16, torch.int64, torch.bool} <= torch.accelerator.get_device_capability()[
        "supported_dtypes"
    ]  # it raised "Backend doesn't support getting device capabilities"
    del x, y


def test_a_device_that_does_not_exist_is_a_runtime_error():
    """As on CUDA (it was an IndexError from a tuple, or a stream of a device that does not exist)."""
    missing = torch.tpu.device_count()
    calls = (torch.tpu.memory_allocated, torch.tpu.mem_get_info, torch.accelerator.memory_stats)
    for call in (*calls, torch.tpu.current_stream, torch.tpu.Stream, torch.accelerator.get_device_capability):
        with pytest.raises(RuntimeError, match=f"tpu:{missing} does not exist"):
            call(missing)


GB = 2**30
# what a TPU's jax.Device.memory_stats() holds (a stand-in: XLA:CPU has none)
_TPU_LIKE = {"bytes_in_use": 100 * GB, "peak_bytes_in_use": 500 * GB, "bytes_limit": 1600 * GB, "pool_bytes": 800 * GB}


def test_a_platforms_own_statistics_are_used(monkeypatch):
    stats = dict(_TPU_LIKE)
    monkeypatch.setattr(runtime_memory.DeviceMemory, "device_stats", lambda self: stats)
    assert torch.tpu.memory_allocated() == 100 * GB
    assert torch.tpu.max_memory_allocated() == 500 * GB
    assert torch.tpu.mem_get_info() == (1500 * GB, 1600 * GB)
    assert torch.tpu.memory_reserved() == torch.tpu.max_memory_reserved() == 800 * GB
    assert torch.tpu.memory_stats()["device.bytes_limit"] == 1600 * GB
    torch.tpu.reset_peak_memory_stats()
    # PJRT's peak cannot be reset: the old one no longer counts, a new one does
    assert torch.tpu.max_memory_allocated() == 100 * GB
    stats["peak_bytes_in_use"] = 700 * GB
    assert torch.tpu.max_memory_allocated() == 700 * GB
