"""Data parallelism over the devices of one process: ``LocalMesh``.

With several devices in one process (several chips on a host, or
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` on CPU), ``tpu:0`` ...
``tpu:N-1`` are separate devices, each with its own pending program. A
``LocalMesh`` is a 1-d mesh of them in the style of torch's ``DeviceMesh``
(``init_device_mesh("tpu", (N,), mesh_dim_names=("dp",))``), without a
process group: one process drives every device, and its collectives take one
tensor per device and run as one XLA program over the mesh (the same rules as
``tpu_dist``'s collectives across processes). Each collective first flushes the
devices' pending programs (it is a sync point of each device).

Or one model over the whole mesh, its tensors sharded (``shard_module``,
``shard_batch``, ``shard``): they keep their full shapes on the mesh's first
device, and each step compiles to one SPMD program over every device (Note
[Sharded tensors] in lazytpu.distributed.spmd).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np
import torch
from torch.distributed.tensor import Shard

from lazytpu.distributed import collectives, spmd
from lazytpu.distributed.jax_runtime import AXIS
from lazytpu.distributed.process_group import bind_result, device_arrays
from lazytpu.runtime import platform

__all__ = ["LocalMesh"]

_REDUCE_OPS = {"sum", "avg", "max", "min", "product"}


class LocalMesh:
    """A 1-d mesh of this process's first ``size`` ``tpu`` devices.

    Args:
        size: how many devices (default: all, ``torch.tpu.device_count()``).
        dim_name: the mesh dimension's name (``mesh_dim_names`` in torch).

    Example, one model sharded over every device (Note [Sharded tensors]
    in lazytpu.distributed.spmd)::

        mesh = LocalMesh()
        model = mesh.shard_module(model)  # each parameter Shard(0) over the mesh
        opt = torch.optim.AdamW(model.parameters())
        for x, y in batches:
            loss = loss_fn(model(mesh.shard_batch(x)), mesh.shard_batch(y))
            ...  # backward, opt.step(): one SPMD program per step

    Example, one replica per device::

        mesh = LocalMesh(dim_name="dp")
        replicas = [copy.deepcopy(model).to(d) for d in mesh.devices]
        ...  # each replica: forward and backward on its slice of the batch
        for grads in zip(*([p.grad for p in r.parameters()] for r in replicas)):
            mesh.all_reduce_(list(grads), op="avg")
    """

    def __init__(self, size: int | None = None, dim_name: str = "dp") -> None:
        count = torch.tpu.device_count()
        size = count if size is None else size
        if not 1 <= size <= count:
            raise ValueError(f"LocalMesh: size must be between 1 and {count} (the tpu device count), got {size}")
        self.device_type = "tpu"
        self.mesh_dim_names = (dim_name,)
        self.devices = [torch.device("tpu", i) for i in range(size)]
        self._mesh = jax.sharding.Mesh(np.array([platform.device(i) for i in range(size)]), (AXIS,))

    def size(self) -> int:
        return len(self.devices)

    def __repr__(self) -> str:
        return f"LocalMesh(tpu, {self.size()} devices, mesh_dim_names={self.mesh_dim_names})"

    def _check(self, tensors, what: str) -> None:
        if len(tensors) != self.size():
            raise ValueError(f"LocalMesh.{what}: expected one tensor per device ({self.size()}), got {len(tensors)}")
        for device, t in zip(self.devices, tensors):
            if t.device != device:
                raise ValueError(f"LocalMesh.{what}: tensor {device.index} is on {t.device}, expected {device}")
        if len({(tuple(t.shape), t.dtype) for t in tensors}) != 1:
            raise ValueError(f"LocalMesh.{what}: the tensors must all have one shape and dtype")

    def _run(self, name: str, tensors, **static) -> list:
        results = collectives.run_local(name, self._mesh, device_arrays(tensors), **static)
        for t, result in zip(tensors, results):
            bind_result(t, result)
        return list(tensors)

    def all_reduce_(self, tensors, op: str = "sum") -> list:
        """Reduce ``tensors`` (one per device, in mesh order) and write the
        result into each, in place. ``op``: sum, avg, max, min or product."""
        if op not in _REDUCE_OPS:
            raise ValueError(f"LocalMesh.all_reduce_: op must be one of {sorted(_REDUCE_OPS)}, got {op!r}")
        self._check(tensors, "all_reduce_")
        return self._run("all_reduce", tensors, op=op, size=self.size())

    def broadcast_(self, tensors, src: int = 0) -> list:
        """Write device ``src``'s tensor into every tensor (one per device), in place."""
        self._check(tensors, "broadcast_")
        return self._run("broadcast", tensors, root=src)

    def scatter(self, tensor: torch.Tensor, dim: int = 0) -> list:
        """``tensor`` (on any device) split into ``size()`` equal chunks along
        ``dim``, chunk ``i`` on device ``i``."""
        if tensor.shape[dim] % self.size():
            raise ValueError(f"LocalMesh.scatter: dim {dim} ({tensor.shape[dim]}) is not divisible by {self.size()}")
        return [chunk.to(device) for chunk, device in zip(tensor.chunk(self.size(), dim), self.devices)]

    # -- one model over the mesh (Note [Sharded tensors] in lazytpu.distributed.spmd) --
    def shard(self, tensor: torch.Tensor, placements: Sequence = (Shard(0),)) -> torch.Tensor:
        """``tensor`` laid out over the mesh by torch's ``placements``
        (``[Shard(dim)]`` or ``[Replicate()]``): ``spmd.shard``."""
        return spmd.shard(tensor, self, placements)

    def shard_module(self, module: torch.nn.Module, placements: Sequence | None = None) -> torch.nn.Module:
        """``module``'s parameters sharded over the mesh, in place (default:
        ``Shard(0)`` where dim 0 divides by ``size()``): ``spmd.shard_module``."""
        return spmd.shard_module(module, self, placements)

    def shard_batch(self, batch: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """``batch`` (on any device) split along ``dim`` over the mesh, on its first device."""
        return spmd.shard(batch, self, [Shard(dim)])
