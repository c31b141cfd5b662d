"""The ``torch.UntypedStorage`` of the ``tpu`` device: what it holds
(``DeviceStorage``), its methods on the ``Storage`` its tensors share
(``TpuStorage``), and the data pointers of storages (Note [Data pointers])."""

from __future__ import annotations

import operator
import threading
import weakref

import torch

from lazytpu.ir import Failed, Storage


class DeviceStorage:
    """What a ``torch.UntypedStorage`` of the tpu device holds (Note [tpu storages]
    in frontend/hostio): a ``Storage`` whose flat bytes are its contents, or,
    until the first tensor is set to it, ``host`` bytes (``host`` is then also the
    memory its data pointer names; ``fresh``: unspecified bytes, never uploaded)."""

    __slots__ = ("storage", "host", "fresh", "index", "__weakref__")

    def __init__(self, storage, host, index: int, fresh: bool = False) -> None:
        self.storage, self.host, self.index, self.fresh = storage, host, index, fresh


STORAGE_TAG = "_lazytpu_device_storage"  # the attribute of a tpu UntypedStorage that holds its DeviceStorage


def device_storage(storage: torch.UntypedStorage) -> DeviceStorage | None:
    """The ``DeviceStorage`` of a tpu ``UntypedStorage`` lazytpu made or handed out, else None."""
    return vars(storage).get(STORAGE_TAG)


def tag_storage(storage: torch.UntypedStorage, held: DeviceStorage) -> torch.UntypedStorage:
    vars(storage)[STORAGE_TAG] = held  # kept: torch keeps a storage's Python object while the storage lives
    return storage


# Note [Storage resize]: FSDP2 frees a parameter's gathered copy between uses
# and allocates it again, keeping every tensor on it (the unsharded parameter,
# the views autograd saved) with ``untyped_storage().resize_(0)`` and
# ``resize_(nbytes)``. A tpu tensor's own untyped storage is a ``TpuStorage``,
# whose ``resize_`` acts on the ``Storage`` its tensors share: ``resize_(0)``
# binds it to ``Failed`` with a ``FreedStorageError`` (the buffer is dropped, so
# the device frees it once no program reads it; a tensor read while freed
# raises that error), ``resize_`` back to its size binds it to a new ``empty``
# value (pending, unspecified: Note [Uninitialized factories] in
# device/registration), and ``nbytes()`` (``size()``) says 0 while it is freed.
# Other sizes are not supported: a storage's value has its base layout's shape.
# The pending program that read the old value keeps it (nodes are immutable), so
# freeing never changes what was computed before.


# Note [Data pointers]: a wrapper subclass's storage has no memory, so torch
# gave every tpu tensor the data pointer 0 (plus its offset) and its untyped
# storage none at all ("invalid python storage"). Code that tells shared
# memory by pointers then saw every tensor share one, or failed:
# transformers' save_pretrained (safetensors' storage_ptr) raised. Each
# ``Storage`` gets, the first time a pointer is asked for, an address range
# of its own, never reused (a counter in a 64-bit space, far above host
# memory): ``x.data_ptr()`` is its start plus the tensor's offset in bytes,
# and ``untyped_storage().data_ptr()`` its start, so views share a storage
# pointer and ranges overlap where memory does, as on CPU. Nothing
# dereferences them (there is no tpu kernel that would). A storage of no
# elements has the address 0, as CPU's (its allocator returns no memory),
# and so has a tensor of no elements (c10 answers a null pointer for one).
_ADDRESSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Storage -> its address
_NEXT_ADDRESS = [1 << 48]
_ADDRESS_LOCK = threading.Lock()


def storage_address(storage: Storage) -> int:
    """The address of ``storage`` (Note [Data pointers])."""
    if not storage.numel:
        return 0
    address = _ADDRESSES.get(storage)
    if address is None:
        reserved = -(-max(storage.numel, 1) * 16 // 64) * 64  # room for any dtype's view of it, 64-byte aligned
        with _ADDRESS_LOCK:
            address = _ADDRESSES.get(storage)
            if address is None:  # not given by another thread meanwhile
                address = _ADDRESSES[storage] = _NEXT_ADDRESS[0]
                _NEXT_ADDRESS[0] += reserved
    return address


class FreedStorageError(RuntimeError):
    """The error of a tensor read while its tpu storage is freed (Note [Storage resize])."""


def freed(storage: Storage) -> bool:
    """Whether ``storage`` was freed by ``resize_(0)`` (Note [Storage resize])."""
    value = storage.value
    return type(value) is Failed and type(value.error) is FreedStorageError


class TpuStorage(torch.UntypedStorage):
    """The ``UntypedStorage`` of a tpu tensor (Note [Storage resize])."""

    def nbytes(self) -> int:
        held = vars(self).get(STORAGE_TAG)
        if held is not None and held.storage is not None and freed(held.storage):
            return 0
        return super().nbytes()

    def data_ptr(self) -> int:
        held = vars(self).get(STORAGE_TAG)
        if held is None or held.storage is None:
            return super().data_ptr()  # host bytes on the device: the host copy's pointer
        return storage_address(held.storage)

    def resize_(self, size: int) -> TpuStorage:
        held = vars(self).get(STORAGE_TAG)
        storage = None if held is None else held.storage
        if storage is None:
            raise RuntimeError("lazytpu: resize_() of a tpu storage that no tensor is set to")
        aval = storage.value.aval
        if size == 0:
            if not freed(storage):
                with storage.graph.lock:
                    error = FreedStorageError("lazytpu: this tensor's storage was freed (untyped_storage().resize_(0))")
                    storage.bind(Failed(error, aval))
        elif size in (aval.nbytes, super().nbytes()):
            if freed(storage):
                fresh = torch.empty(aval.shape, dtype=aval.dtype, device=torch.device("tpu", storage.graph.index))
                value = fresh._lt_storage.value
                with storage.graph.lock:
                    storage.bind(value, fresh._lt_storage.graph)
        else:
            raise NotImplementedError(
                f"lazytpu: resize_({size}) of a tpu storage of {aval.nbytes} bytes: only resize_(0) (free) and "
                "resize_ back to its size are supported (Note [Storage resize])"
            )
        return self

    # Note [Storage bytes]: torch's own storage methods copy or fill bytes
    # through the storage's data pointer, which a tensor's tpu storage does not
    # have ("invalid python storage"); they run here on a uint8 tensor set to
    # the storage (a dtype view of its value), so that ``storage.cpu()``,
    # ``clone()``, ``copy.deepcopy``, ``fill_`` and ``copy_`` between tpu
    # storages read and write the tensors on it.
    def _bytes(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8, device=self.device).set_(self)

    def _tensors_storage(self) -> bool:
        held = vars(self).get(STORAGE_TAG)
        return held is not None and held.storage is not None

    def cpu(self):
        return self._bytes().cpu().untyped_storage() if self._tensors_storage() else super().cpu()

    def clone(self):
        if not self._tensors_storage():
            return super().clone()
        # a storage of host bytes on tpu (Note [tpu storages] in frontend/hostio): a plain UntypedStorage,
        # which TypedStorage requires of what it wraps
        return torch.UntypedStorage(self.nbytes(), device=self.device).copy_(self.cpu())

    def __reduce__(self):
        """``pickle`` and ``torch.save``: as a byte tensor on it, which torch saves as the tensors on this
        storage (one record for all: Note [Checkpoint storages] in frontend/hostio); torch's own
        ``__reduce__`` saved it with ``torch.save``, which took it for no storage, over and over."""
        if not self._tensors_storage():
            return super().__reduce__()
        return operator.methodcaller("untyped_storage"), (self._bytes(),)

    def _write_file(self, *args, **kwargs):
        """The legacy ``torch.save`` format's writer (``pickle`` of a ``TypedStorage`` takes it): the bytes."""
        if not self._tensors_storage():
            return super()._write_file(*args, **kwargs)
        return self.cpu()._write_file(*args, **kwargs)

    def fill_(self, value):
        if not self._tensors_storage():
            return super().fill_(value)
        self._bytes().fill_(value)
        return self

    def copy_(self, source, non_blocking=None):
        if not self._tensors_storage():
            return super().copy_(source, non_blocking)
        if source.nbytes() != self.nbytes():
            have, given = self.nbytes(), source.nbytes()
            raise RuntimeError(f"size does not match, self was {have} bytes but src was {given} bytes")
        src = source._bytes() if isinstance(source, TpuStorage) and source._tensors_storage() else source
        self._bytes().copy_(src if isinstance(src, torch.Tensor) else torch.empty(0, dtype=torch.uint8).set_(src))
        return self
