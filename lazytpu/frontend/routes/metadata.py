"""Ops answered from metadata alone: sizes, storages and layouts, no values read.

The CPU fallback would copy their tensors to the host to answer what the
tensors' descriptions already say (and lose what they share).
"""

from __future__ import annotations

import torch

from lazytpu.frontend import hostio
from lazytpu.frontend.record import handles
from lazytpu.frontend.routes.views import storage_nbytes
from lazytpu.frontend.tensor import LazyTensor

aten = torch.ops.aten


def _storage_numel(t) -> int:
    nbytes = storage_nbytes(t) if type(t) is LazyTensor else t.untyped_storage().nbytes()
    return nbytes // t.dtype.itemsize


@handles(aten._has_same_storage_numel.default)
def has_same_storage_numel(func, args, kwargs):
    """Metadata only (the CPU fallback copied both tensors to the host)."""

    return _storage_numel(args[0]) == _storage_numel(args[1])


@handles(aten.is_same_size.default)
def is_same_size(func, args, kwargs):
    """Sizes only, of tensors of any devices (forward AD's ``copy_`` asks it of a CPU and a tpu tangent)."""
    return args[0].shape == args[1].shape


@handles(aten.is_set_to.default)
def is_set_to(func, args, kwargs):
    """CPU's answer from metadata: the same storage, offset, sizes and strides
    (the CPU fallback compared two host copies, which never share a storage)."""
    self, src = args
    return (
        type(src) is LazyTensor
        and self._lt_storage is src._lt_storage
        and self.storage_offset() == src.storage_offset()
        and self.shape == src.shape
        and self.stride() == src.stride()
    )


@handles(aten.dense_dim.default, aten.sparse_dim.default, aten.is_coalesced.default)
def layout_dims(func, args, kwargs):
    """A strided tensor's answers, as CPU's (tpu has no sparse layouts)."""
    if func is aten.is_coalesced.default:
        raise RuntimeError("is_coalesced expected sparse coordinate tensor layout but got Strided")
    return args[0].dim() if func is aten.dense_dim.default else 0


_SPARSE_RESULTS = {
    aten._to_sparse.default: torch.sparse_coo,
    aten._to_sparse.sparse_dim: torch.sparse_coo,
    aten._to_sparse_csr.default: torch.sparse_csr,
    aten._to_sparse_csc.default: torch.sparse_csc,
    aten._to_sparse_bsr.default: torch.sparse_bsr,
    aten._to_sparse_bsc.default: torch.sparse_bsc,
}


@handles(*_SPARSE_RESULTS)
def to_sparse(func, args, kwargs):
    """Refused before anything runs (Note [Sparse layouts on tpu] in
    lazytpu.device.registration): the CPU fallback read the tensor to the host
    and converted it, and only then refused the sparse result."""
    raise hostio.not_strided(kwargs.get("layout") or _SPARSE_RESULTS[func])


@handles(aten._new_zeros_with_same_feature_meta.default)
def new_zeros_with_same_feature_meta(func, args, kwargs):
    """Forward AD's zero tangent laid out as its primal (a view's tangent is a
    window of the same shape on a storage of the primal's size, at its offset),
    with ``self``'s leading batch dims in front, contiguous across the batch
    (torch's kernel; the CPU fallback made it on the host)."""
    self, other = args[:2]
    batch_dims = args[2] if len(args) > 2 else kwargs.get("self_num_batch_dims", 0)
    sizes = list(self.shape[:batch_dims]) + list(other.shape)
    numel = _storage_numel(other)
    strides = list(other.stride())
    for size in reversed(self.shape[:batch_dims]):
        strides.insert(0, numel)
        numel *= size
    flat = torch.zeros(numel, dtype=other.dtype, device=other.device)
    return flat.as_strided(sizes, strides, other.storage_offset())
