"""Moving tensors between CPU torch and the device (syncing when needed)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

from lazytpu import runtime
from lazytpu.aliasing import view_dtype
from lazytpu.engine import context
from lazytpu.ir import Aval, Data, Failed, Output

# numpy has no bfloat16: move its bits as uint16 (Note [bfloat16 transfers]).
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
    storage = t._lt_storage
    if isinstance(storage.value, Output):
        context(t.device.index or 0).flush(reason)
    if isinstance(storage.value, Failed):
        raise RuntimeError(f"lazytpu: this tensor's value could not be computed: {storage.value.error}")
    array = runtime.to_host(storage.value.buffer)
    dtype = t.dtype if view_dtype(t) is None else storage.value.aval.dtype  # Note [Dtype views]
    bits = _BITS.get(dtype)
    if bits:
        base = torch.from_numpy(np.array(array, copy=True).view(np.int16)).view(dtype)
    else:
        base = torch.from_numpy(np.array(array, copy=True))
        if base.dtype != dtype:  # complex32 (Note [complex32 storage])
            base = base.to(dtype)
    if t._lt_window is None and t.is_contiguous():
        return base.reshape(t.shape)
    physical = torch.empty_strided(base.shape, storage.stride, dtype=dtype)
    if torch._debug_has_internal_overlap(physical) == 1:  # empty_strided allows a self-overlapping layout
        flat = physical.as_strided((physical.untyped_storage().nbytes() // physical.element_size(),), (1,))
        flat[torch.arange(flat.numel()).as_strided(base.shape, storage.stride).reshape(-1)] = base.reshape(-1)
    else:
        physical.copy_(base)
    if dtype is not t.dtype:  # the storage's bytes as t's dtype, padded to a whole element
        raw = torch.empty(0, dtype=torch.uint8).set_(physical.untyped_storage())
        raw = torch.cat([raw, raw.new_zeros(-raw.numel() % t.dtype.itemsize)])
        physical = raw.view(t.dtype)
    view = physical.as_strided(t.shape, t.stride(), t.storage_offset())
    if is_non_overlapping_and_dense(view):
        return view.clone(memory_format=torch.preserve_format) if t._lt_window is not None else view
    return view.contiguous()
