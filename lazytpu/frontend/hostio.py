"""Moving tensors between CPU torch and the device (syncing when needed)."""

from __future__ import annotations

import functools
import sys
import weakref

import ml_dtypes
import numpy as np
import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

from lazytpu import _caches, _dtypes, engine_flush, runtime
from lazytpu.engine import context
from lazytpu.frontend.storages import DeviceStorage, device_storage, tag_storage
from lazytpu.frontend.tensor import LazyTensor, contiguous_strides, describe, tpu_device
from lazytpu.frontend.windows import new_tensor, view_dtype
from lazytpu.ir import Aval, Data, Failed, Output

# Note [bfloat16 transfers]: torch's ``numpy()`` has no bfloat16 (nor float8):
# such a tensor moves as its bits, an int16 (uint8) view on torch's side and
# ``ml_dtypes``' type on numpy's.
_BITS = {
    torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
    torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
    torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2),
    torch.float8_e4m3fnuz: (torch.uint8, ml_dtypes.float8_e4m3fnuz),
    torch.float8_e5m2fnuz: (torch.uint8, ml_dtypes.float8_e5m2fnuz),
}


MAX_DIMS = 64  # numpy's, so JAX's: a tpu tensor's value has at most this many dims


def not_strided(layout: torch.layout) -> NotImplementedError:
    """The error for a sparse (or other non-strided) tensor made on or moved to tpu."""
    return NotImplementedError(
        f"lazytpu: a tpu tensor is strided (dense); a {layout} tensor cannot be made or moved to tpu. "
        "Keep it on CPU, or call .to_dense() before .to('tpu')"
    )


def data_from_cpu(t: torch.Tensor, index: int = 0) -> Data:
    """Copy a CPU tensor to the device."""
    t = t.detach()
    if t.layout != torch.strided:
        raise not_strided(t.layout)
    if t.is_nested:  # the strided nested layout: no kernel runs on it on tpu (docs/limitations.md)
        raise NotImplementedError(
            "lazytpu: tpu has no nested tensors of the strided layout (those of layout=torch.jagged work). "
            "nn.TransformerEncoder makes one in its inference fast path (eval, no grad, a src_key_padding_mask): "
            "build it with enable_nested_tensor=False"
        )
    if t.is_quantized:
        raise NotImplementedError(
            f"lazytpu: tpu has no quantized tensors ({t.dtype}); keep it on CPU, or call .dequantize() first"
        )
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dim() > MAX_DIMS:
        raise RuntimeError(f"tpu tensors have at most {MAX_DIMS} dims (numpy's limit), got {t.dim()}")
    t = t.resolve_conj().resolve_neg().contiguous()
    if t.dtype is torch.complex32:  # stored widened (Note [complex32 storage])
        t = t.to(torch.complex64)
    bits = _BITS.get(t.dtype)
    # read through DLPack: ``numpy()`` would mark the CPU tensor's storage as not resizable (for good: a
    # later ``x.resize_()`` of the user's tensor failed); from_host copies before anything can resize it
    array = np.from_dlpack(t.view(bits[0])).view(bits[1]) if bits else np.from_dlpack(t)
    return Data(runtime.from_host(array, index), Aval(tuple(t.shape), t.dtype))


def to_cpu(t, reason: str = "cpu") -> torch.Tensor:
    """A CPU copy of a LazyTensor with its shape, strides and dtype.

    Copies the storage's base value and takes the tensor's window on the host
    (Note [Views as strides]): reading a view needs no device program. A
    contiguous window of a base laid out contiguously is copied alone: an
    element of a million-element result (``bool(mask[i])`` in a loop) copied
    the million.
    """
    array, dtype = _host_array(t, reason)
    return _from_host(t, array, dtype)


def item(t) -> bool | int | float | complex:
    """``t.item()``: the element read from the host copy of ``t``'s storage, with no CPU tensor made for it
    where numpy holds it in ``t``'s dtype (a loss read each step, ``if mask[i]:`` in a loop)."""
    array, dtype = _host_array(t, "item")
    if dtype is t.dtype and dtype not in _BITS and t._lt_storage.stride == contiguous_strides(array.shape):
        if dtype is not torch.complex32 and t.numel() == 1:  # (complex32 is stored widened)
            return array.reshape(-1)[t.storage_offset()].item()
    return _from_host(t, array, dtype).item()


def _from_host(t, array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """``t``'s window of its storage's host ``array`` (of ``dtype``'s elements) as a CPU tensor."""
    if t._lt_windowed and dtype is t.dtype and t.is_contiguous():
        if t._lt_storage.stride == contiguous_strides(array.shape):  # its elements lie in one run of the base's
            start = t.storage_offset()
            return _as_torch(array.reshape(-1)[start : start + t.numel()], dtype).view(t.shape)
    base = _as_torch(array, dtype)
    if not t._lt_windowed and t.is_contiguous():
        return base.reshape(t.shape)
    view = _host_memory(t, base).as_strided(t.shape, t.stride(), t.storage_offset())
    if is_non_overlapping_and_dense(view):
        return view.clone(memory_format=torch.preserve_format) if t._lt_windowed else view
    return view.contiguous()


def _host_base(t, reason: str) -> torch.Tensor:
    """The value of ``t``'s storage on the host: its logical base array, in the
    dtype the storage holds (Note [Dtype views]; computed first if pending)."""
    return _as_torch(*_host_array(t, reason))


def _host_array(t, reason: str) -> tuple[np.ndarray, torch.dtype]:
    """The value of ``t``'s storage as the device holds it (computed first if pending), and
    the torch dtype its elements have (Note [Dtype views])."""
    storage = t._lt_storage
    ctx = context(t.device.index or 0)
    array = None
    if isinstance(storage.value, Output):
        lane = ctx.lane_of(storage)  # the lane of the thread that computes it (Note [Lanes])
        array = engine_flush.constant_value(ctx, lane, storage)  # Note [Constant reads]
        if array is None:
            ctx.flush(reason, lane=lane)
    if array is None:
        if isinstance(storage.value, Failed):
            ctx.read_value_checks()  # a failed check's own error first, at the read that shows it
            raise RuntimeError(f"lazytpu: this tensor's value could not be computed: {storage.value.error}")
        with engine_flush.failures_as_torch_errors():
            array = runtime.to_host(storage.value.buffer)
    ctx.read_value_checks()  # now that the read has waited for its program (Note [Value checks])
    return array, t.dtype if view_dtype(t) is None else storage.value.aval.dtype  # Note [Dtype views]


def _as_torch(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A host array of the device's dtype as a CPU tensor of ``dtype``."""
    bits = _BITS.get(dtype)
    if bits:
        return _host_copy(array.view(_dtypes.to_jax(bits[0])), bits[0]).view(dtype)
    base = _host_copy(array, _dtypes.to_torch(array.dtype))
    return base.to(dtype) if base.dtype != dtype else base  # complex32 (Note [complex32 storage])


def _host_copy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A copy of ``array`` in memory torch allocated: resizable, as any CPU tensor's (``from_numpy``'s never
    is: ``t.cpu().resize_()`` and an ``out=`` of it that must grow raised), written through DLPack."""
    out = torch.empty(array.shape, dtype=dtype)
    np.copyto(np.from_dlpack(out), array)
    return out


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


# -- checkpoints and storages ------------------------------------------------------

# Note [Checkpoint storages]: ``torch.save`` writes each storage once, and
# ``torch.load`` rebuilds every tensor as a window on its loaded storage: that
# is how tensors sharing memory (views, tied weights) keep sharing it. A tpu
# tensor is saved as torch saves a CUDA one, ``_rebuild_tensor_v2(storage,
# offset, size, stride, ...)`` (which ``weights_only=True`` allows), where
# ``storage`` is a host copy of its whole tpu storage: one copy per storage per
# save (``saved_storage``), so torch writes it once, tagged with the device it
# came from (``storage_location``), so that ``map_location`` applies to it as
# to a CUDA storage: loaded with ``map_location="cpu"`` the checkpoint is plain
# CPU torch (lazytpu need not be imported); loaded to tpu (no map, "tpu",
# "tpu:i", a device, a dict, or a callable returning ``storage.tpu()``) each
# storage becomes a tpu storage (Note [tpu storages]) and each tensor a window
# on it. Files saved in the earlier format,
# ``_rebuild_device_tensor_from_cpu_tensor`` of a host tensor on a storage
# tagged ``tpu:i``, load the same way (a callable map meets torch's error for
# that rebuild function). Pickling by other means follows: ``pickle`` round
# trips the storage through ``torch.save`` (the tag brings it back to tpu),
# ``copy.copy`` is an alias as on CPU (``__copy__``), and
# ``torch.multiprocessing`` has a reducer of its own (device/serialization).
#
# Note [tpu storages]: torch gives a Python backend no allocator, so
# ``torch.UntypedStorage(n, device="tpu")`` would crash and a tpu tensor's
# ``untyped_storage()`` has no data. lazytpu hands out two kinds of tpu
# ``UntypedStorage``, each holding a ``DeviceStorage`` (``frontend/storages``):
# a tensor's own (``untyped_storage()``, which holds the tensor's ``Storage``:
# the sizes are CPU's, the values read back through torch's storage methods,
# ``.cpu()``, ``.tolist()``, indexing, and ``data_ptr()`` raises as for any
# tensor subclass without data), and a storage of host bytes on the device
# (``on_device``: what ``torch.load`` restores to tpu and
# ``torch.UntypedStorage(n, device="tpu")`` makes), whose data pointer is the
# host copy's. Torch then sets tensors to such storages (``_rebuild_tensor``,
# ``storage.copy_``): the first such ``set_`` uploads the host bytes as one
# flat array of the tensor's dtype (``storage_for``), and every tensor set to
# the storage is a window on that upload, as on CPU. A tensor of another dtype
# set to it later is a view of that dtype (Note [Dtype views] in
# lowering/strided), or, when no tensor holds the upload any more (the
# ``uint8`` tensor of torch's ``storage.copy_``), the upload becomes that dtype.

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


# The DeviceStorage of each live tpu storage of host bytes, by its data pointer (the host
# copy's, which that DeviceStorage keeps alive): torch's C++ makes tensors over such a
# storage's pointer as storages of their own (the legacy torch.load, pickle's path).
_BY_POINTER: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def on_device(host: torch.UntypedStorage, index: int, *, fresh: bool = False) -> torch.UntypedStorage:
    """A tpu ``UntypedStorage`` of ``host``'s bytes (Note [tpu storages]);
    ``fresh``: its contents are unspecified (``torch.UntypedStorage(n, device="tpu")``)."""
    memory = torch._C._construct_storage_from_data_pointer(host.data_ptr(), tpu_device(index), host.nbytes())
    held = DeviceStorage(None, host, index, fresh)
    if host.nbytes():
        _BY_POINTER[host.data_ptr()] = held
    return tag_storage(memory, held)


def held_by(storage: torch.UntypedStorage) -> DeviceStorage | None:
    """What the tpu ``storage`` holds: its own ``DeviceStorage``, or that of the
    tpu storage of host bytes whose memory it is; None for any other."""
    held = device_storage(storage)
    if held is None and storage.nbytes() and storage.device.type == "tpu":
        try:
            held = _BY_POINTER.get(storage.data_ptr())
        except RuntimeError:  # a tensor subclass's storage without data
            return None
    return held


class _Probe:
    __slots__ = ("storage",)


def _held_only_by(held: DeviceStorage) -> bool:
    """Whether only ``held`` holds its ``storage``: no tensor is a window on it
    (a tensor holds its storage; the graph's references are weak). The count is
    read as a probe's, an object held by one attribute, is read in the same
    frame: a frame-evaluation hook (dynamo's, once ``torch.compile`` has run)
    can add references of its own to a call's arguments, so a fixed count
    would be wrong after it."""
    probe = _Probe()
    probe.storage = object()
    return sys.getrefcount(held.storage) <= sys.getrefcount(probe.storage)


def storage_for(held: DeviceStorage, dtype: torch.dtype, nbytes: int):
    """The ``Storage`` that a tensor of ``dtype`` set to the tpu storage
    holding ``held`` is a window on (uploaded now if it is still host bytes;
    Note [tpu storages])."""
    if nbytes % dtype.itemsize:
        dtype = torch.uint8  # its tensors are views of their own dtype on its bytes
    n = nbytes // dtype.itemsize
    storage = held.storage
    if storage is None:
        if held.fresh:
            base = torch.empty(n, dtype=dtype, device=tpu_device(held.index))
        else:
            flat = torch.empty(0, dtype=dtype).set_(held.host, 0, (n,), (1,))
            base = new_tensor(data_from_cpu(flat, held.index), (n,), (1,), dtype, held.index)
        held.storage = base._lt_storage
    elif storage.value.aval.dtype is not dtype and reinterpretable(storage.value.aval.dtype, torch.uint8):
        del storage
        if _held_only_by(held):  # nothing sees the old upload: it becomes this dtype
            held.storage = _as_dtype(held.storage, dtype, nbytes)._lt_storage
    return held.storage


def _as_dtype(storage, dtype: torch.dtype, nbytes: int) -> LazyTensor:
    """A new flat tensor of ``dtype`` holding ``storage``'s bytes."""
    raw = LazyTensor(storage, describe((nbytes,), (1,), 0, nbytes, torch.uint8))  # needs no grad
    if dtype is torch.bool:  # a bool's byte is 0 or 1: a value, not a view
        return raw.ne(0)
    return raw.view(dtype).clone()


def reinterpretable(have: torch.dtype, want: torch.dtype) -> bool:
    """Whether a window of ``want`` may read a storage of ``have`` (Note [Dtype views]):
    not complex32 (stored as complex64), whose views are computed as values. A bool is
    the byte 0 or 1, as ``view(dtype)`` of a bool tensor reads it."""
    return have is want or torch.complex32 not in (have, want)
