"""One process, many devices: tensors sharded over a ``LocalMesh``, one SPMD
program per step.

Note [Sharded tensors]: a tensor sharded over a ``LocalMesh`` of ``N``
devices keeps its full logical shape and stays on the mesh's first device
(``tpu:0``): model code, autograd and optimizers see an ordinary ``tpu``
tensor. Only its buffer changes: a global ``jax.Array`` laid out over the
mesh by a ``jax.sharding.NamedSharding`` (``Shard(d)``: split along ``d``,
each device holding ``1/N``; ``Replicate()``: a full copy on each). Ops on it
are recorded into ``tpu:0``'s pending program as any others, and a flush
whose inputs are sharded compiles that one program as an SPMD program over
the mesh: XLA's partitioner propagates the inputs' shardings, inserts the
collectives (the all-gathers of sharded parameters, the reduce-scatters of
their gradients) and shards the outputs (Note [SPMD programs] in
lazytpu.runtime.executor). A training step is then the step's usual
programs (Note [Step segments] in lazytpu.engine), each one SPMD program
over every device, and its parameters, gradients and optimizer state stay
sharded: FSDP2's memory (each device about ``1/N`` of them) with no wrapper
modules, hooks or process group. Why not one tensor per device (as
``LocalMesh``'s collectives take, or as DTensor's local shards): the model
code would change, each device would dispatch programs of its own, and the
collectives would be ours to schedule; here the compiler sees the whole step
and schedules them, as ``jax.jit`` of a sharded step does. A value read on
the host (``.cpu()``, ``.item()``) is gathered from the shards.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import torch
from jax.sharding import NamedSharding, PartitionSpec
from torch.distributed.tensor import Replicate, Shard

from lazytpu.distributed.process_group import bind_result, device_arrays
from lazytpu.engine import context
from lazytpu.frontend.tensor import LazyTensor
from lazytpu.frontend.windows import read, write_value
from lazytpu.ir import Failed, Node, Output
from lazytpu.ir.template import Slot, Template
from lazytpu.lowering.registry import lowering
from lazytpu.runtime import executor

__all__ = ["placements", "shard", "shard_module"]


def _spec(mesh, shape: torch.Size, placements: Sequence) -> PartitionSpec:
    """The ``PartitionSpec`` of torch ``placements`` for a tensor of ``shape``."""
    if isinstance(placements, (Shard, Replicate)) or len(placements) != 1:
        raise ValueError(
            f"lazytpu: a LocalMesh is 1-d: placements must be a sequence of one Shard(dim) or Replicate(), "
            f"got {placements!r}"
        )
    (placement,) = placements
    if isinstance(placement, Replicate):
        return PartitionSpec()
    if not isinstance(placement, Shard):
        raise ValueError(f"lazytpu: only Shard(dim) and Replicate() place a tensor on a LocalMesh, got {placement!r}")
    dim = placement.dim + len(shape) if placement.dim < 0 else placement.dim
    if not 0 <= dim < len(shape):
        raise ValueError(f"lazytpu: cannot Shard({placement.dim}) a tensor of {len(shape)} dims")
    if shape[dim] % mesh.size():
        raise ValueError(
            f"lazytpu: Shard({placement.dim}) of a tensor of shape {tuple(shape)}: dim {dim} ({shape[dim]}) "
            f"is not divisible by the mesh size ({mesh.size()})"
        )
    return PartitionSpec(*[None] * dim, mesh._mesh.axis_names[0])


def shard(tensor: torch.Tensor, mesh, placements: Sequence = (Shard(0),)) -> torch.Tensor:
    """Lay ``tensor`` out over ``mesh`` (Note [Sharded tensors]).

    Args:
        tensor: a ``tpu`` tensor on the mesh's first device, sharded in place
            (a ``Parameter`` stays the same object); any other tensor is
            first copied there.
        mesh: a ``LocalMesh``.
        placements: ``[Shard(dim)]`` or ``[Replicate()]``, torch's
            placements (``torch.distributed.tensor``), one per mesh dim.

    Returns:
        The tensor, of its full logical shape, on the mesh's first device.

    Raises:
        ValueError: a placement other than ``Shard``/``Replicate``, a dim
            not divisible by the mesh size, a view of another tensor.
    """
    spec = _spec(mesh, tensor.shape, placements)
    home = mesh.devices[0]
    if tensor.device != home:
        tensor = tensor.to(home)
    if tensor._lt_windowed:
        raise ValueError("lazytpu: cannot shard a view of part of another tensor; shard the tensor it views")
    (buffer,) = device_arrays([tensor])  # its pending program runs first
    sharded = executor.shard_buffer(buffer, NamedSharding(mesh._mesh, spec), home.index or 0)
    with torch.no_grad():
        bind_result(tensor, sharded)
    if tensor.is_leaf and tensor.requires_grad:
        if getattr(tensor, "_lt_grad_spec", None) is None:
            tensor.register_post_accumulate_grad_hook(_shard_grad)
        tensor._lt_grad_spec = spec
    return tensor


SHARD_AS = "lazytpu.shard_as"


@lowering(SHARD_AS)
def _shard_as(x, *, spec: PartitionSpec):
    """``x`` laid out as ``spec`` over the mesh of the program; unchanged in a
    program of one device (Note [SPMD programs] in lazytpu.runtime.executor)."""
    if jax.sharding.get_abstract_mesh().empty:
        return x
    return jax.lax.with_sharding_constraint(x, spec)


def _shard_grad(param: torch.Tensor) -> None:
    """After a gradient is accumulated into ``param.grad``: lay it out as
    ``param`` (Note [Sharded gradients])."""
    grad = param.grad
    if not isinstance(grad, LazyTensor):
        return
    if grad._lt_windowed:  # a view of a larger value (a bias's summed gradient): its own storage
        with torch.no_grad():
            grad = param.grad = grad.clone()
    ctx = context(grad.device.index or 0)
    with ctx.graph.lock:
        value = read(grad)
        node = Node(SHARD_AS, Template((Slot(0),), (("spec", param._lt_grad_spec),)), (value,), (value.aval,))
        write_value(grad, Output(node, 0))
        ctx.recorded(node)


# Note [Sharded gradients]: XLA's partitioner chooses the sharding of each
# value a program computes; for a gradient it often chooses replicated (an
# all-reduce), or another dim than its parameter's. A program that writes the
# gradients out (the backward's segment, Note [Step segments] in
# lazytpu.engine) would then hold full gradients on every device, and the
# optimizer's program would reshard them. So a sharded parameter's
# gradient is recorded through a sharding constraint (``SHARD_AS``, lowered to
# ``jax.lax.with_sharding_constraint``) to the parameter's own layout, each
# time one is accumulated (``register_post_accumulate_grad_hook``): the
# partitioner then reduce-scatters it, and each device holds ``1/N`` of the
# gradients, as FSDP2's.


def shard_module(module: torch.nn.Module, mesh, placements: Sequence | None = None) -> torch.nn.Module:
    """Shard ``module``'s parameters over ``mesh``, in place, FSDP2's way.

    Args:
        module: the model, on any device: it is moved to the mesh's first
            device first.
        mesh: a ``LocalMesh``.
        placements: for every parameter; default ``[Shard(0)]`` for each
            parameter whose dim 0 divides by the mesh size, ``[Replicate()]``
            for the others.

    Buffers (running statistics, rotary tables) are replicated. Returns ``module``.
    """
    module.to(mesh.devices[0])
    for p in module.parameters():
        if placements is not None:
            shard(p, mesh, placements)
        else:
            divisible = p.dim() > 0 and p.shape[0] % mesh.size() == 0
            shard(p, mesh, [Shard(0)] if divisible else [Replicate()])
    for b in module.buffers():
        shard(b, mesh, [Replicate()])
    return module


def placements(tensor: torch.Tensor) -> tuple | None:
    """How ``tensor`` (a view: the tensor it views) is laid out over a mesh:
    ``(Shard(dim),)`` or ``(Replicate(),)``; None for a tensor on its device
    alone. A pending value is computed first."""
    storage = tensor._lt_storage
    if isinstance(storage.value, Output):
        ctx = context(tensor.device.index or 0)
        ctx.flush("placements", lane=ctx.lane_of(storage))
    if isinstance(storage.value, Failed):
        raise RuntimeError(f"lazytpu: the tensor could not be computed: {storage.value.error}")
    sharding = storage.value.buffer.sharding
    if not isinstance(sharding, NamedSharding) or len(sharding.device_set) == 1:
        return None
    for dim, axes in enumerate(sharding.spec):
        if axes is not None:
            return (Shard(dim),)
    return (Replicate(),)
