"""``torch.distributed._functional_collectives`` on ``tpu`` tensors.

The functional ops (``_c10d_functional.*``) reach lazytpu's dispatcher like
any other op; each is handled here by the group's in-place collective on a
fresh output tensor. Results are device values already (Note in
process_group), so ``wait_tensor`` has nothing to wait for.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch._C._distributed_c10d import _resolve_process_group

from lazytpu.frontend.record import handles

fn = torch.ops._c10d_functional


def _group(name) -> dist.ProcessGroup:
    return _resolve_process_group(name) if isinstance(name, str) else name


def _opts(cls, **fields):
    opts = cls()
    for key, value in fields.items():
        setattr(opts, key, value)
    return opts


def _reduce_op(name: str) -> dist.ReduceOp:
    return getattr(dist.ReduceOp, name.upper())


def _all_reduce_(tensors, op: str, group) -> None:
    _group(group).allreduce(list(tensors), _opts(c10d.AllreduceOptions, reduceOp=_reduce_op(op)))


def _gathered(t, size: int):
    return t.new_empty((size * t.shape[0], *t.shape[1:]) if t.dim() else (size,))


def _scattered(t, size: int):
    return t.new_empty((t.shape[0] // size, *t.shape[1:]))


@handles(fn.all_reduce.default)
def all_reduce(func, args, kwargs):
    t, op, group = args
    out = t.clone()
    _all_reduce_([out], op, group)
    return out


@handles(fn.all_reduce_.default)
def all_reduce_(func, args, kwargs):
    t, op, group = args
    _all_reduce_([t], op, group)
    return t


@handles(fn.all_reduce_coalesced.default)
def all_reduce_coalesced(func, args, kwargs):
    tensors, op, group = args
    outs = [t.clone() for t in tensors]
    _all_reduce_(outs, op, group)
    return outs


@handles(fn.all_reduce_coalesced_.default)
def all_reduce_coalesced_(func, args, kwargs):
    tensors, op, group = args
    _all_reduce_(tensors, op, group)
    return tensors


def _all_gather(t, out, group):
    _group(group).all_gather_single(out, t, c10d.AllgatherOptions())
    return out


@handles(fn.all_gather_into_tensor.default)
def all_gather_into_tensor(func, args, kwargs):
    t, size, group = args
    return _all_gather(t, _gathered(t, size), group)


@handles(fn.all_gather_into_tensor_out.default)
def all_gather_into_tensor_out(func, args, kwargs):
    t, size, group = args
    return _all_gather(t, kwargs["out"], group)


@handles(fn.all_gather_into_tensor_coalesced.default)
def all_gather_into_tensor_coalesced(func, args, kwargs):
    tensors, size, group = args
    return [_all_gather(t, _gathered(t, size), group) for t in tensors]


def _reduce_scatter(t, op: str, out, group):
    _group(group).reduce_scatter_single(out, t, _opts(c10d.ReduceScatterOptions, reduceOp=_reduce_op(op)))
    return out


@handles(fn.reduce_scatter_tensor.default)
def reduce_scatter_tensor(func, args, kwargs):
    t, op, size, group = args
    return _reduce_scatter(t, op, _scattered(t, size), group)


@handles(fn.reduce_scatter_tensor_out.default)
def reduce_scatter_tensor_out(func, args, kwargs):
    t, op, size, group = args
    return _reduce_scatter(t, op, kwargs["out"], group)


@handles(fn.reduce_scatter_tensor_coalesced.default)
def reduce_scatter_tensor_coalesced(func, args, kwargs):
    tensors, op, size, group = args
    return [_reduce_scatter(t, op, _scattered(t, size), group) for t in tensors]


@handles(fn.all_to_all_single.default)
def all_to_all_single(func, args, kwargs):
    t, out_splits, in_splits, group = args
    rows = sum(out_splits) if out_splits else t.shape[0]
    out = t.new_empty((rows, *t.shape[1:]))
    _group(group).all_to_all_single(out, t, list(out_splits), list(in_splits), c10d.AllToAllOptions())
    return out


def _broadcast_(t, src: int, group):
    _group(group).broadcast([t], _opts(c10d.BroadcastOptions, rootRank=src))
    return t


@handles(fn.broadcast.default)
def broadcast(func, args, kwargs):
    t, src, group = args
    return _broadcast_(t.clone(), src, group)


@handles(fn.broadcast_.default)
def broadcast_(func, args, kwargs):
    t, src, group = args
    return _broadcast_(t, src, group)


@handles(fn.wait_tensor.default)
def wait_tensor(func, args, kwargs):
    return args[0]


@handles(torch.ops._dtensor.shard_dim_alltoall.default)
def shard_dim_alltoall(func, args, kwargs):
    """DTensor's Shard(a) -> Shard(b) on one mesh dimension: every rank's
    ``t`` concatenated along ``gather_dim``, then this rank's chunk along
    ``shard_dim`` (as torch's fake kernel: chunks of ``size // n``), as one
    all-to-all of the chunks."""
    t, gather_dim, shard_dim, group = args
    pg = _group(group)
    n = pg.size()
    gather_dim, shard_dim = gather_dim % t.dim(), shard_dim % t.dim()
    chunk = t.shape[shard_dim] // n
    blocks = t.narrow(shard_dim, 0, chunk * n).unflatten(shard_dim, (n, chunk)).movedim(shard_dim, 0).contiguous()
    out = torch.empty_like(blocks)
    pg.all_to_all_single(out, blocks, [], [], c10d.AllToAllOptions())
    return torch.cat(out.unbind(0), dim=gather_dim)
