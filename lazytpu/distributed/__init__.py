"""``torch.distributed`` for ``tpu`` tensors: the ``tpu_dist`` backend.

After ``import lazytpu``::

    torch.distributed.init_process_group(backend="tpu_dist")  # or "tpu", or "cpu:gloo,tpu:tpu_dist"

reads the usual launcher environment (``MASTER_ADDR``, ``MASTER_PORT``,
``RANK``, ``WORLD_SIZE``, as ``torchrun`` sets), starts JAX's multi-process
runtime once (Note [One JAX runtime per process]) and gives torch a process
group whose collectives on ``tpu`` tensors are XLA collectives. Call it before
the first ``tpu`` tensor of the process.
"""

from __future__ import annotations

import torch.distributed as dist

from lazytpu.distributed import (
    checkpoint,
    ddp,
    functional,  # noqa: F401  (handlers of _c10d_functional ops)
)
from lazytpu.distributed.jax_runtime import JaxOptions, options
from lazytpu.distributed.local import LocalMesh
from lazytpu.distributed.process_group import BACKEND, ProcessGroupTPU

__all__ = ["BACKEND", "JaxOptions", "LocalMesh", "ProcessGroupTPU", "options"]

ALIASES = (BACKEND, "tpu")


def _create(backend_opts, pg_options) -> ProcessGroupTPU:
    """torch's constructor hook (``extended_api``): one call per group and rank."""
    from lazytpu.distributed import jax_runtime

    rank, size = backend_opts.group_rank, backend_opts.group_size
    ranks = tuple(backend_opts.global_ranks_in_group) or tuple(range(size))
    if not jax_runtime.started():
        if dist.is_initialized() and dist.get_world_size() > 1:
            raise RuntimeError(
                "lazytpu: the tpu_dist backend must be part of the default process group "
                "(init_process_group(backend='tpu_dist') or 'cpu:gloo,tpu:tpu_dist'), since JAX's "
                "multi-process runtime starts with it"
            )
        jax_runtime.ensure_started(backend_opts.store, rank, size, backend_opts.timeout)
    return ProcessGroupTPU(backend_opts.store, rank, size, backend_opts.timeout, ranks)


def register() -> None:
    """Register ``tpu_dist`` (and its alias ``tpu``) with torch.distributed. Idempotent."""
    if not dist.is_available():
        return
    for name in ALIASES:
        if name.upper() not in dist.Backend._plugins:
            dist.Backend.register_backend(name, _create, extended_api=True, devices=["tpu"])


register()
ddp.install()
checkpoint.install()
