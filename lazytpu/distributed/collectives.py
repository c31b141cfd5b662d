"""Collectives as XLA programs over a 1-d mesh of processes (pure JAX).

A collective rule is a function of one process's local array (at least 1-d)
and keyword-only static attributes, written with ``jax.lax`` collectives over
``axis``: a mesh axis name or a tuple of them, the group's ranks in row-major
order (``AXIS`` by default; an in-graph collective of a subgroup names the
world mesh's axes its group spans, Note [Subgroups in the world mesh] in
lazytpu.distributed.ingraph); ``run`` wraps it in ``shard_map`` and ``jit`` (once
per rule, mesh and attributes), builds the global array from each process's
local one and returns this process's local results. Knows nothing of torch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lazytpu import _caches
from lazytpu._registry import Registry
from lazytpu.distributed.jax_runtime import AXIS

REDUCE_OPS = ("sum", "avg", "max", "min", "product", "band", "bor", "bxor")

RULES = Registry("collective rule")  # name -> rule


def rule(name: str):
    """Register a collective rule under ``name`` (a duplicate raises)."""
    return RULES.register(name)


# -- helpers ---------------------------------------------------------------------

_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def to_bits(x):
    """``x`` as unsigned integers of its width (so a masked sum moves it exactly)."""
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint8)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return to_bits(jnp.stack([x.real, x.imag]))
    return lax.bitcast_convert_type(x, _UNSIGNED[x.dtype.itemsize])


def _from_bits(bits, dtype):
    if dtype == jnp.bool_:
        return bits.astype(jnp.bool_)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        parts = _from_bits(bits, jnp.finfo(dtype).dtype)
        return lax.complex(parts[0], parts[1])
    return lax.bitcast_convert_type(bits, dtype)


_BITWISE = {"band": jnp.bitwise_and, "bor": jnp.bitwise_or, "bxor": jnp.bitwise_xor}


def _reduce_stacked(stacked, op: str):
    """Reduce axis 0 of ``stacked`` (one slice per rank) with ``op``."""
    if op in ("sum", "avg"):
        out = jnp.sum(stacked, axis=0, dtype=stacked.dtype)
        return _divide(out, stacked.shape[0]) if op == "avg" else out
    if op == "product":
        return jnp.prod(stacked, axis=0, dtype=stacked.dtype)
    if op == "max":
        return jnp.max(stacked, axis=0)
    if op == "min":
        return jnp.min(stacked, axis=0)
    return functools.reduce(_BITWISE[op], [stacked[i] for i in range(stacked.shape[0])])


def _divide(x, n: int):
    if jnp.issubdtype(x.dtype, jnp.integer):
        return x // n
    return (x / n).astype(x.dtype)


# bool follows torch: SUM and MAX are OR, PRODUCT and MIN are AND.
_BOOL_OP = {
    "sum": "max",
    "avg": "max",
    "max": "max",
    "bor": "max",
    "min": "min",
    "product": "min",
    "band": "min",
    "bxor": "bxor",
}


# -- rules -------------------------------------------------------------------------


@rule("all_reduce")
def all_reduce(x, *, op: str, size: int, axis=AXIS):
    if x.dtype == jnp.bool_:
        return all_reduce(x.astype(jnp.uint8), op=_BOOL_OP[op], size=size, axis=axis).astype(jnp.bool_)
    if op in ("sum", "avg"):
        out = lax.psum(x, axis)
        return _divide(out, size) if op == "avg" else out
    if op == "max":
        return lax.pmax(x, axis)
    if op == "min":
        return lax.pmin(x, axis)
    return _reduce_stacked(lax.all_gather(x, axis), op)


@rule("broadcast")
def broadcast(x, *, root: int, axis=AXIS):
    bits = to_bits(x)
    mine = lax.axis_index(axis) == root
    return _from_bits(lax.psum(jnp.where(mine, bits, jnp.zeros_like(bits)), axis), x.dtype)


@rule("all_gather")
def all_gather(x, *, out_shape: tuple[int, ...], axis=AXIS):
    """Every rank's ``x`` concatenated along axis 0, shaped ``out_shape``."""
    return lax.all_gather(x, axis, axis=0, tiled=True).reshape(out_shape)


@rule("all_gather_list")
def all_gather_list(x, *, size: int, axis=AXIS):
    """Every rank's ``x``, one output per rank."""
    gathered = lax.all_gather(x, axis)
    return tuple(gathered[i] for i in range(size))


@rule("reduce_scatter")
def reduce_scatter(x, *, op: str, size: int, axis=AXIS):
    """Reduce ``x`` (rank i's share is its i-th block along axis 0) and keep our block."""
    if x.dtype == jnp.bool_:
        return reduce_scatter(x.astype(jnp.uint8), op=_BOOL_OP[op], size=size, axis=axis).astype(jnp.bool_)
    if op in ("sum", "avg"):
        out = lax.psum_scatter(x, axis, scatter_dimension=0, tiled=True)
        return _divide(out, size) if op == "avg" else out
    blocks = lax.all_to_all(x, axis, 0, 0, tiled=True)
    return _reduce_stacked(blocks.reshape(size, x.shape[0] // size, *x.shape[1:]), op)


@rule("all_to_all")
def all_to_all(x, *, axis=AXIS):
    """Block i of our ``x`` (axis 0) goes to rank i; block j of the result came from rank j."""
    return lax.all_to_all(x, axis, 0, 0, tiled=True)


@rule("scatter")
def scatter(x, *, root: int, axis=AXIS):
    """Rank ``root``'s block i (axis 0) goes to rank i; other ranks' ``x`` is ignored."""
    bits = to_bits(x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):  # bits are (2, ...): scatter along axis 1
        mine = jnp.where(lax.axis_index(axis) == root, bits, jnp.zeros_like(bits))
        return _from_bits(lax.psum_scatter(mine, axis, scatter_dimension=1, tiled=True), x.dtype)
    mine = jnp.where(lax.axis_index(axis) == root, bits, jnp.zeros_like(bits))
    return _from_bits(lax.psum_scatter(mine, axis, scatter_dimension=0, tiled=True), x.dtype)


@rule("permute")
def permute(x, *, pairs: tuple[tuple[int, int], ...], axis=AXIS):
    """Send ``x`` from mesh position ``a`` to ``b`` for each ``(a, b)``; others receive zeros."""
    return lax.ppermute(x, axis, perm=pairs)


# -- driver ---------------------------------------------------------------------------


@functools.cache
def _program(name: str, mesh, n_in: int, static: tuple):
    body = functools.partial(RULES[name], **dict(static))
    spec = P(AXIS)
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec,) * n_in, out_specs=spec))


_caches.register("distributed_programs", _program.cache_clear)


def run(name: str, mesh, arrays: Sequence[jax.Array], **static) -> list[jax.Array]:
    """Run collective ``name`` on this process's ``arrays`` (each on its mesh device).

    Returns this process's results (one array, or one per rank for
    ``all_gather_list``), still computing (JAX dispatch is asynchronous).
    0-d arrays travel as shape ``(1,)``; results come back as they were made.
    """
    size = mesh.devices.size
    sharding = NamedSharding(mesh, P(AXIS))
    inputs = []
    for a in arrays:
        if a.ndim == 0:
            a = a.reshape(1)
        inputs.append(jax.make_array_from_single_device_arrays((size * a.shape[0], *a.shape[1:]), sharding, [a]))
    outs = _program(name, mesh, len(inputs), tuple(sorted(static.items())))(*inputs)
    if not isinstance(outs, tuple):
        outs = (outs,)
    return [o.addressable_shards[0].data for o in outs]


def run_local(name: str, mesh, shards: Sequence[jax.Array], **static) -> list[jax.Array]:
    """Run collective ``name`` over a mesh of this process's devices: ``shards``
    holds one array per mesh device (in mesh order, each on its device, all of
    one shape). Returns each device's result, in mesh order (one collective
    result per device; ``all_gather_list`` is not supported here).
    """
    devices = list(mesh.devices.flat)
    shards = [s.reshape(1) if s.ndim == 0 else s for s in shards]
    shape = (len(shards) * shards[0].shape[0], *shards[0].shape[1:])
    sharding = NamedSharding(mesh, P(AXIS))
    out = _program(name, mesh, 1, tuple(sorted(static.items())))(
        jax.make_array_from_single_device_arrays(shape, sharding, shards)
    )
    by_device = {s.device: s.data for s in out.addressable_shards}
    return [by_device[d] for d in devices]
