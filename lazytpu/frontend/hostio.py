"""Moving tensors between CPU torch and the device (syncing when needed)."""

from __future__ import annotations

import functools
import weakref

import ml_dtypes
import numpy as np
import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

from lazytpu import _caches, runtime
from lazytpu.engine import context
from lazytpu.frontend.windows import new_tensor, rebind_metadata, view_dtype, view_of
from lazytpu.ir import Aval, Data, Failed, Output

# Note [bfloat16 transfers]: torch's ``numpy()`` has no bfloat16: a bfloat16
# tensor moves as its bits, an int16 view on torch's side and
# ``ml_dtypes.bfloat16`` on numpy's.
_BITS = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16)}


def data_from_cpu(t: torch.Tensor, index: int = 0) -> Data:
    """Copy a CPU tensor to the device."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    if t.dtype is torch.complex32:  # stored widened (Note [complex32 storage])
        t = t.to(torch.complex64)
    bits = _BITS.get(t.dtype)
    array = t.view(bits[0]).numpy().view(bits[1]) if bits else t.numpy()
    return Data(runtime.from_host(array, index), Aval(tuple(t.shape), t.dtype))


def to_cpu(t, reason: str = "cpu") -> torch.Tensor:
    """A CPU copy of a LazyTensor with its shape, strides and dtype.

    Copies the storage's base value and takes the tensor's window on the host
    (Note [Views as strides]): reading a view needs no device program.
    """
    base = _host_base(t, reason)
    if not t._lt_windowed and t.is_contiguous():
        return base.reshape(t.shape)
    view = _host_memory(t, base).as_strided(t.shape, t.stride(), t.storage_offset())
    if is_non_overlapping_and_dense(view):
        return view.clone(memory_format=torch.preserve_format) if t._lt_windowed else view
    return view.contiguous()


def _host_base(t, reason: str) -> torch.Tensor:
    """The value of ``t``'s storage on the host: its logical base array, in the
    dtype the storage holds (Note [Dtype views]; computed first if pending)."""
    storage = t._lt_storage
    ctx = context(t.device.index or 0)
    if isinstance(storage.value, Output):
        ctx.flush(reason, lane=ctx.lane_of(storage))  # the lane of the thread that computes it (Note [Lanes])
    if isinstance(storage.value, Failed):
        raise RuntimeError(f"lazytpu: this tensor's value could not be computed: {storage.value.error}")
    array = runtime.to_host(storage.value.buffer)
    ctx.read_value_checks()  # now that the read has waited for its program (Note [Value checks])
    dtype = t.dtype if view_dtype(t) is None else storage.value.aval.dtype  # Note [Dtype views]
    bits = _BITS.get(dtype)
    if bits:
        return torch.from_numpy(np.array(array, copy=True).view(np.int16)).view(dtype)
    base = torch.from_numpy(np.array(array, copy=True))
    return base.to(dtype) if base.dtype != dtype else base  # complex32 (Note [complex32 storage])


def _host_memory(t, base: torch.Tensor) -> torch.Tensor:
    """``base`` laid out in memory as ``t``'s storage is (its strides, gaps
    zeroed), as a CPU tensor whose storage holds ``t``'s storage's bytes read
    as ``t``'s dtype."""
    storage = t._lt_storage
    if base.dtype is t.dtype and base.stride() == storage.stride:
        return base  # already laid out as the storage is (from_numpy of a fresh contiguous array)
    physical = torch.empty_strided(base.shape, storage.stride, dtype=base.dtype)
    memory = physical.untyped_storage()
    if memory.nbytes() != base.numel() * base.element_size():
        memory.fill_(0)  # gaps between the elements read as zeros (a checkpoint's bytes are deterministic)
    if torch._debug_has_internal_overlap(physical) == 1:  # empty_strided allows a self-overlapping layout
        flat = physical.as_strided((memory.nbytes() // physical.element_size(),), (1,))
        flat[torch.arange(flat.numel()).as_strided(base.shape, storage.stride).reshape(-1)] = base.reshape(-1)
    else:
        physical.copy_(base)
    if base.dtype is not t.dtype:  # the storage's bytes as t's dtype, padded to a whole element
        raw = torch.empty(0, dtype=torch.uint8).set_(memory)
        raw = torch.cat([raw, raw.new_zeros(-raw.numel() % t.dtype.itemsize)])
        physical = raw.view(t.dtype)
    return physical


# -- checkpoints ----------------------------------------------------------------

# Note [Checkpoint storages]: ``torch.save`` writes each storage once, and
# ``torch.load`` rebuilds every tensor as a window on its loaded storage: that
# is how tensors sharing memory (views, tied weights) keep sharing it. A tpu
# tensor is saved as torch saves a device tensor without storage,
# ``_rebuild_device_tensor_from_cpu_tensor(cpu, dtype, "tpu:i", requires_grad)``
# (which ``weights_only=True`` allows), where ``cpu`` has the tensor's size,
# strides and offset on a host copy of its whole tpu storage: one copy per
# storage per save (``saved_storage``), so torch writes it once. That copy is
# tagged with the device it came from (``storage_location``), so that
# ``map_location`` applies to it: loaded with ``map_location="cpu"``, the
# checkpoint is plain CPU torch, sharing as CPU tensors do (lazytpu need not
# be imported). Loaded to tpu, ``restore_storage`` marks the loaded host
# storage, the ``.to("tpu:i")`` of the first tensor on it uploads it whole, and
# every tensor on it becomes a window on that upload (``load_into``).

# id(tpu Storage) -> its host copy, while that copy lives (torch.save holds it until the file is written).
_SAVED: dict[int, weakref.ref] = _caches.table("saved_storages")


def saved_storage(t) -> torch.UntypedStorage:
    """The host copy of ``t``'s whole storage that ``torch.save`` writes
    (computing it first if pending), made once for every tensor on that
    storage (Note [Checkpoint storages])."""
    storage, key = t._lt_storage, id(t._lt_storage)
    ref = _SAVED.get(key)
    host = None if ref is None else ref()
    source = None if host is None else host._lazytpu_source
    if source is None or source[0] is not storage or source[1] is not storage.value:
        host = _host_memory(t, _host_base(t, reason="save")).untyped_storage()
        # holding the storage keeps its id from being reused while cached; its value says the copy is current
        host._lazytpu_source = (storage, storage.value)
        host._lazytpu_location = str(t.device)
        _SAVED[key] = weakref.ref(host, functools.partial(_forget_saved, key))
    return host


def _forget_saved(key: int, ref: weakref.ref) -> None:
    if _SAVED.get(key) is ref:
        del _SAVED[key]


def storage_location(storage) -> str | None:
    """``torch.save``'s tagger (``register_package``): the device a host copy
    made by ``saved_storage`` comes from; None for any other storage."""
    return getattr(storage, "_lazytpu_location", None)


class _Loaded:
    """The mark of a host storage ``torch.load`` read for tpu tensors: its upload, once made."""

    __slots__ = ("base",)

    def __init__(self) -> None:
        self.base = None


def restore_storage(storage, location: str):
    """``torch.load``'s deserializer (``register_package``) for a storage saved
    from tpu: it stays on the host, marked for ``load_into``."""
    if location != "tpu" and not location.startswith("tpu:"):
        return None
    mapped = torch.serialization._serialization_tls.map_location
    if isinstance(mapped, (str, torch.device)) or (isinstance(mapped, dict) and location in mapped.values()):
        return None  # a map onto tpu, which may hold any storage: not handled here
    storage._lazytpu_loaded = _Loaded()
    return storage


def load_into(dst, src: torch.Tensor) -> bool:
    """``dst.copy_(src)`` when ``src`` is a tensor ``torch.load`` rebuilt on a
    storage saved from tpu and ``dst`` the new tensor of its ``.to("tpu:i")``:
    make ``dst`` a window on the one upload of that storage instead (Note
    [Checkpoint storages]). False, doing nothing, for any other copy."""
    if type(src) is not torch.Tensor or src.layout is not torch.strided:
        return False
    memory = src.untyped_storage()
    loaded = getattr(memory, "_lazytpu_loaded", None)
    if loaded is None or src.is_conj() or src.is_neg() or dst._lt_windowed:
        return False
    if dst.dtype is not src.dtype or dst.shape != src.shape:
        return False
    index = dst.device.index or 0
    base = loaded.base
    if base is None:
        whole = src.storage_offset() == 0 and src.numel() * src.element_size() == memory.nbytes()
        host = src if whole and is_non_overlapping_and_dense(src) else torch.empty(0, dtype=src.dtype).set_(memory)
        base = loaded.base = new_tensor(data_from_cpu(host, index), host.shape, host.stride(), host.dtype, index)
    elif (base.device.index or 0) != index or base.dtype is not src.dtype:
        return False
    rebind_metadata(dst, view_of(base, src.shape, src.stride(), src.storage_offset()))
    return True
