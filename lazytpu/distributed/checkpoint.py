"""``torch.distributed.checkpoint`` (DCP) on ``tpu`` tensors.

Note [Distributed checkpoints]: DCP needs nothing of a device but what torch
gives any tensor, and that works on tpu as it is: ``dcp.save`` plans the
state dict's tensors and DTensors (their local shards), then its file writer
copies each item it writes to the host (``tensor.to("cpu",
non_blocking=True)`` on ``torch.tpu``'s current stream, then the stream's
``synchronize``): one host read per tensor written, the first a sync point
that computes what is pending (Note [One queue] in device/streams). ``dcp.load``
reads each stored chunk on the host and ``copy_``s it into the slice of the
destination tensor it covers (a DTensor's local tensor): one upload per chunk,
recorded like any write, so the destination stays a tpu tensor (a DTensor
keeps its mesh and placements) and a checkpoint saved with N ranks loads with
M, or in one process without a process group, as DCP reshards it. What DCP
could not do on tpu is staging, the copy to host memory of ``dcp.async_save``
and of ``DefaultStager``: its ``StateDictStager`` copies a tensor's storage
only when the tensor has a data pointer, and a tpu tensor has none (a
tensor subclass without data), so it deep-copied the tensor's Python insides
instead (and failed on a lock) or, for a Parameter, left its values
unwritten. ``install`` gives it the host copy of a tpu tensor: a window on the
host copy of its whole storage, made once per storage (``saved_storage``,
Note [Checkpoint storages] in frontend/hostio), so views staged together
share one host storage as the stager shares a CUDA storage.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint._state_dict_stager import StateDictStager

from lazytpu.frontend import hostio
from lazytpu.frontend.tensor import LazyTensor, user_state


def _staged(stager: StateDictStager, x: LazyTensor, memo: dict, non_blocking: bool) -> torch.Tensor:
    """A CPU copy of the tpu tensor ``x``, as ``StateDictStager._offload_tensor``
    makes one of a CUDA tensor: same window on a host copy of the storage,
    without ``requires_grad``, with ``x``'s Python attributes staged too."""
    memory = hostio.saved_storage(x)  # a blocking read: the copy is complete when staging returns
    y = torch.empty(0, dtype=x.dtype).set_(memory, x.storage_offset(), x.shape, x.stride())
    memo[id(x)] = y
    for name, value in user_state(x).items():
        setattr(y, name, stager.deepcopy_with_tensor_offload(value, memo, non_blocking=non_blocking))
    return y


def install() -> None:
    """Let DCP's ``StateDictStager`` stage tpu tensors (Note [Distributed
    checkpoints]). Idempotent."""
    original = StateDictStager._offload_tensor
    if getattr(original, "_lt_staging", False):
        return

    def _offload_tensor(self, x, memo, non_blocking=False):
        if isinstance(x, LazyTensor):
            return _staged(self, x, memo, non_blocking)
        return original(self, x, memo, non_blocking=non_blocking)

    _offload_tensor._lt_staging = True
    StateDictStager._offload_tensor = _offload_tensor
