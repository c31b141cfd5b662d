"""FSDP2 (``torch.distributed.fsdp.fully_shard``) on ``tpu``.

FSDP2 runs on ``tpu`` through torch's own code: its all-gathers and
reduce-scatters are the ``tpu_dist`` group's collectives, recorded into the
step's program when the mesh is the whole world (Note [In-graph collectives]
in lazytpu.distributed.ingraph); what it needs of the device is here and in
the places it cites:

- freeing and re-allocating the gathered parameters between uses with
  ``untyped_storage().resize_`` (Note [Storage resize] in frontend/tensor);
- its streams and per-layer events, which must not cut the step into a
  program per layer (Note [Deferred events] in device/streams);
- its custom ops (Note [FSDP ops]).

Note [FSDP ops]: FSDP2 defines ``fsdp.all_gather_copy_in``,
``fsdp.split_with_sizes_copy`` and ``fsdp.chunk_cat`` with Python kernels for
PrivateUse1 (and ``fsdp.copy_`` for the devices it knows), which torch never
calls for a Python backend: a tpu tensor's ops all reach
``LazyTensor.__torch_dispatch__``, where an op without a rule would run on CPU
and cut the program. Each is handled here by its kernel's body: its torch ops
on tpu tensors are recorded like any (a narrow, a split and a foreach copy; a
``split_with_sizes_copy``; a ``_chunk_cat``), so an all-gather's copy-in and
copy-out and a reduce-scatter's copy-in are part of the step's program.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param

from lazytpu.frontend.record import handles

_KERNELS = {
    torch.ops.fsdp.all_gather_copy_in.default: _fsdp_collectives.all_gather_copy_in_cuda,
    torch.ops.fsdp.split_with_sizes_copy.default: _fsdp_collectives.split_with_sizes_copy,
    torch.ops.fsdp.chunk_cat.default: _fsdp_collectives.chunk_cat,
    torch.ops.fsdp.copy_.default: _fsdp_param.copy_,
}


def _handler(kernel):
    def run(func, args, kwargs):
        return kernel(*args, **kwargs)

    run.__name__ = run.__qualname__ = f"fsdp_{kernel.__name__}"
    return run


def install() -> None:
    """Handle FSDP2's custom ops on tpu (Note [FSDP ops]). Idempotent."""
    from lazytpu.frontend.record import HANDLERS

    for op, kernel in _KERNELS.items():
        if op not in HANDLERS:
            handles(op)(_handler(kernel))
