"""Dispatch-level handlers: ops that are about where data lives, not math.

Device moves, ``copy_``, aliasing (``detach``/``alias`` share a storage,
Note [Storage]), host reads (``item``) and factories.
"""

from __future__ import annotations

import torch

from lazytpu import hostio
from lazytpu.dispatch import assign, handles, record, resize_to, wrap
from lazytpu.lowering import get_rule
from lazytpu.tensor import LazyTensor

aten = torch.ops.aten


@handles(aten._to_copy.default)
def to_copy(func, args, kwargs):
    (src,) = args
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "cpu":
        host = hostio.to_cpu(src)
        rest = {k: v for k, v in kwargs.items() if k in ("dtype", "memory_format")}
        return host.to(**rest) if rest else host
    if type(src) is not LazyTensor:  # cpu -> tpu
        moved = hostio.data_from_cpu(src, torch.device(device).index or 0)
        out = wrap(moved, src.shape, src.stride(), src.dtype, torch.device(device).index or 0)
        dtype = kwargs.get("dtype")
        return out if dtype is None or dtype == src.dtype else aten._to_copy.default(out, dtype=dtype)
    rest = {k: v for k, v in kwargs.items() if k != "device"}
    return record(func, args, rest, get_rule(func))


@handles(aten.copy_.default)
def copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if type(dst) is not LazyTensor:  # tpu -> cpu
        return dst.copy_(hostio.to_cpu(src))
    if type(src) is not LazyTensor:  # cpu -> tpu
        index = dst.device.index or 0
        src = wrap(hostio.data_from_cpu(src, index), src.shape, src.stride(), src.dtype, index)
    if tuple(src.shape) != tuple(dst.shape):
        torch.broadcast_shapes(src.shape, dst.shape)  # torch's error if not broadcastable
        src = aten.expand.default(src, list(dst.shape))
    assign(dst, src)
    return dst


@handles(aten.detach.default, aten.alias.default, aten.lift_fresh.default)
def share(func, args, kwargs):
    src = args[0]
    if type(src) is not LazyTensor:
        return src
    return LazyTensor(src._lt_storage, src.shape, src.stride(), src.dtype, src.device.index or 0)


@handles(aten._local_scalar_dense.default)
def local_scalar(func, args, kwargs):
    (src,) = args
    return hostio.to_cpu(src, reason="item").item()


@handles(aten.resize_.default)
def resize_(func, args, kwargs):
    dst, size = args[0], args[1]
    resize_to(dst, size)
    return dst


@handles(aten.is_pinned.default)
def is_pinned(func, args, kwargs):
    return False


@handles(aten.set_.source_Tensor)
def set_(func, args, kwargs):
    dst, src = args
    if tuple(dst.shape) != tuple(src.shape):
        resize_to(dst, src.shape, src.stride())
    dst._lt_storage = src._lt_storage
    return dst
