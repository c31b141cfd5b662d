"""Storages, checkpoints and host memory of the ``tpu`` device in torch:
``torch.load``'s ``map_location`` onto tpu, ``torch.UntypedStorage(n,
device="tpu")``, ``storage.tpu()``, and ``pin_memory()`` (``registration``
installs them).

Note [Pinned memory]: torch asks the accelerator's hooks for a pinned-memory
allocator (``DataLoader(pin_memory=True)``, ``Tensor.pin_memory()``), and a
Python backend's hooks cannot provide one (``torch._C._acc.PrivateUse1Hooks``
overrides only ``is_available``, ``has_primary_context`` and ``is_built``):
without more, pinning raises ``NotImplementedError`` on tpu. With tpu the
current accelerator, ``pin_memory()`` returns a copy in ordinary host memory,
with one warning that says so; ``is_pinned()`` is False, and a copy from it
to tpu (``non_blocking=True`` or not) is an ordinary upload. With another
accelerator current (CUDA in the same process), torch's own kernel runs.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from multiprocessing.reduction import ForkingPickler

import torch
from torch.utils.data import get_worker_info

from lazytpu import runtime
from lazytpu.frontend import hostio
from lazytpu.frontend.tensor import LazyTensor
from lazytpu.ir.source import user_stacklevel

_STORAGE_NEW = torch.UntypedStorage.__new__


def _is_tpu(location: str) -> bool:
    return location == "tpu" or location.startswith("tpu:")


def _index(device: torch.device) -> int:
    return runtime.platform.index_or_current(device.index)


def restore_storage(storage: torch.UntypedStorage, location: str):
    """``torch.load``'s deserializer (``register_package``) for a storage whose
    location is tpu after ``map_location``: a tpu storage of its bytes, which
    the tensors rebuilt on it upload once (Note [tpu storages] in frontend/hostio);
    None for any other location. torch's errors for a device that is absent."""
    if not _is_tpu(location):
        return None
    device = torch.serialization._validate_device(location, "tpu")
    return hostio.on_device(storage, _index(device))


def _in_worker_error() -> RuntimeError:
    """Note [tpu tensors between processes]."""
    info = get_worker_info()
    return RuntimeError(
        f"lazytpu: DataLoader worker {info.id} made a batch of tpu tensors, which cannot leave a worker "
        "process (tpu memory is not shared between processes). Return CPU tensors from the dataset and move "
        "each batch to tpu in the main process (batch.to('tpu'), with pin_memory=True if you like)."
    )


def _raise_received(message: str):
    raise RuntimeError(message)


def reduce_for_another_process(t: LazyTensor):
    """``torch.multiprocessing``'s reducer of tpu tensors (``ForkingPickler``).

    Note [tpu tensors between processes]: tpu memory is not shared between
    processes (CUDA's is, by IPC handles), so a tpu tensor sent to another
    process is a copy: a host copy, moved to tpu where it is received. A
    DataLoader worker's batch must not be one: it would be computed by a
    second process holding the device (a forked one cannot at all, Note
    [Fork] in lazytpu.runtime.platform), so a worker whose dataset returns
    tpu tensors gets a clear error: in the worker, where ``default_collate``
    makes its batch in shared memory (``torch.UntypedStorage(..., device="tpu")``),
    or, for a batch another collate function made, where the batch is received
    (a worker's queue pickles in a thread of its own, where an error would
    lose the batch and leave the loader waiting).
    """
    if get_worker_info() is not None:
        return _raise_received, (str(_in_worker_error()),)
    if vars(t).get("_is_param"):
        return torch._utils._rebuild_parameter, (t.detach(), t.requires_grad, OrderedDict())
    # By value: a host copy sent through shared memory is freed with the
    # pickler, before a process being spawned inherits its file descriptor.
    data = torch.empty(0, dtype=torch.uint8).set_(hostio.saved_storage(t)).numpy().tobytes()
    layout = (t.storage_offset(), tuple(t.shape), t.stride())
    return _receive, (data, t.dtype, layout, str(t.device), t.requires_grad)


def _receive(data: bytes, dtype: torch.dtype, layout: tuple, device: str, requires_grad: bool) -> torch.Tensor:
    """A tensor ``reduce_for_another_process`` sent, on tpu in the receiver."""
    memory = torch.frombuffer(bytearray(data), dtype=torch.uint8).untyped_storage() if data else torch.UntypedStorage()
    host = torch.empty(0, dtype=dtype).set_(memory, *layout)
    return torch._utils._rebuild_device_tensor_from_cpu_tensor(host, dtype, device, requires_grad)


_SHARE_MEMORY = torch.UntypedStorage.share_memory_
_warned_sharing = []


def _share_memory(self, *args, **kwargs):
    """``share_memory_()`` (``module.share_memory()``): a no-op for a tpu
    storage, as for CUDA's, but tpu memory is not shared with the processes a
    tensor is sent to (Note [tpu tensors between processes]); a warning says so."""
    if self.device.type == "tpu" and not _warned_sharing:
        _warned_sharing.append(True)
        warnings.warn(
            "lazytpu: share_memory_() of a tpu tensor: tpu memory is not shared between processes, so a process "
            "it is sent to gets a copy, and its updates are not seen here (Hogwild training needs CPU tensors). "
            "This warning is shown once.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )
    return _SHARE_MEMORY(self, *args, **kwargs)


def _untyped_storage_new(cls, *args, device=None, **kwargs):
    """``torch.UntypedStorage(..., device="tpu")``: a tpu storage of host bytes
    (Note [tpu storages] in frontend/hostio); torch's own for any other device."""
    if device is None:
        return _STORAGE_NEW(cls, *args, **kwargs)
    device = torch.device(device)
    if device.type != "tpu":
        return _STORAGE_NEW(cls, *args, device=device, **kwargs)
    if get_worker_info() is not None:  # default_collate's shared batch (Note [tpu tensors between processes])
        raise _in_worker_error()
    host = _STORAGE_NEW(cls, *args, **kwargs)  # a size, or a sequence of byte values
    fresh = not args or isinstance(args[0], int)
    return hostio.on_device(host, _index(device), fresh=fresh)


_warned_pinning = []


def _pin_memory(self, device=None):
    """``aten::_pin_memory`` of a CPU tensor (Note [Pinned memory])."""
    target = torch.device(device).type if device is not None else torch.accelerator.current_accelerator().type
    if target != "tpu":
        return torch.ops.aten._pin_memory.default._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, self, device)
    if not _warned_pinning:
        _warned_pinning.append(True)
        warnings.warn(
            "lazytpu: torch gives a Python backend no pinned-memory allocator, so pin_memory() on tpu returns a "
            "copy in ordinary host memory (copies to tpu are ordinary uploads). This warning is shown once.",
            UserWarning,
            stacklevel=2,
        )
    out = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype)
    return out.copy_(self)


def register(lib: torch.library.Library) -> None:
    """Install the deserializer, the tpu storage constructor and methods, and
    the CPU ``_pin_memory`` kernel (in ``lib``, which the caller keeps alive)."""
    # Before the CPU deserializer (10) and torch's privateuse1 one (23), which
    # needs an allocator a Python backend has none of (Note [tpu storages] in frontend/hostio).
    torch.serialization.register_package(9, hostio.storage_location, restore_storage)
    # The patches of a torch class for storages: torch's constructor crashes the
    # process for a device with no allocator (DataLoader workers' default_collate
    # calls it), and its share_memory_() says nothing where tpu memory is not shared.
    torch.UntypedStorage.__new__ = staticmethod(_untyped_storage_new)
    torch.UntypedStorage.share_memory_ = _share_memory
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=False, for_module=False, for_packed_sequence=False, for_storage=True
    )  # storage.tpu(), storage.is_tpu, as storage.cuda()
    lib.impl("_pin_memory", _pin_memory, "CPU")  # Note [Pinned memory]
    ForkingPickler.register(LazyTensor, reduce_for_another_process)  # Note [tpu tensors between processes]
