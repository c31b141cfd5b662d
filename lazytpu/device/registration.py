"""Register ``tpu`` as torch's PrivateUse1 backend (the recipe in
docs/architecture.md, "Device registration").

This is the one module that touches torch's global registration tables.
"""

from __future__ import annotations

import functools

import torch
from torch.optim import optimizer as _optimizer
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils import _foreach_utils
from torch.utils.backend_registration import _setup_privateuseone_for_python_backend

from lazytpu import _config, runtime
from lazytpu.device import (
    accelerator,
    autocast,
    backward_errors,
    checkpoint,
    module_conversion,
    sdpa,
    serialization,
    tpu,
)
from lazytpu.device.backward_errors import probe as _probe
from lazytpu.device.backward_errors import rescue
from lazytpu.device.module_conversion import keep_parameters
from lazytpu.engine import context
from lazytpu.frontend import hostio
from lazytpu.frontend.checks import bounds
from lazytpu.frontend.dispatch import dispatch
from lazytpu.frontend.generator import TpuGenerator
from lazytpu.frontend.record import record
from lazytpu.frontend.routes import handlers
from lazytpu.frontend.tensor import LazyTensor, dlpack_refused
from lazytpu.lowering import get_rule

aten = torch.ops.aten


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return tpu.is_available()

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


_PRIVATEUSE1 = torch._C._autograd.DeviceType.PrivateUse1


class _DeviceGuard(torch._C._acc.DeviceGuard):
    def type_(self):
        try:
            _probe()  # Note [Errors in backward] in lazytpu.device.backward_errors
        except BaseException as exc:  # noqa: BLE001 - an error left set by a hook, raised by backward()
            rescue(exc)
        return _PRIVATEUSE1  # called twice per op: no attribute chain


# Note [Uninitialized factories]: torch makes a tensor on ``tpu`` from a host
# one (``x.to("tpu")``, ``torch.tensor(data, device="tpu")``) as ``empty``
# then ``copy_``, which re-binds the storage to the host data. The ``empty``
# node is recorded but, even in strict mode, not run at once: its value is
# unspecified, so it runs only if something reads it before it is overwritten
# (the next flush), and a copy from the host runs no program.
def _empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    kwargs = {"dtype": dtype or torch.get_default_dtype(), "device": device}
    if memory_format is not None:
        kwargs["memory_format"] = memory_format
    func = aten.empty.memory_format
    out = record(func, (list(size),), kwargs, get_rule(func), flush=False)  # Note [Uninitialized factories]
    return _filled(out)


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    kwargs = {"dtype": dtype or torch.get_default_dtype(), "device": device}
    func = aten.empty_strided.default
    out = record(func, (list(size), list(stride)), kwargs, get_rule(func), flush=False)
    return _filled(out)


def _filled(out):
    """Note [Deterministic uninitialized memory] in frontend/routes/handlers: the fill
    recorded directly (a kernel that torch's C++ calls, as in ``torch.tensor(data,
    device="tpu")``, must not call a tensor method)."""
    value = handlers.uninitialized_value(out.dtype)
    return out if value is None else dispatch(aten.fill_.Scalar, (out, value), {})


def _arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    """``torch.arange(..., device="tpu")`` as one recorded op: torch's own
    kernel for a backend without one is ``empty``, ``arange.out``, a resize
    and a copy (150 µs a call against 15)."""
    if dtype is None:  # torch's rule; explicit, since 5 and 5.0 are one static value in a call's memo keys
        floating = any(isinstance(v, float) for v in (start, end, step))
        dtype = torch.get_default_dtype() if floating else torch.int64
    return dispatch(aten.arange.start_step, (start, end, step), {"dtype": dtype, "device": device})


def _optimizer_devices(optimizer) -> list[int]:
    """The indices of the tpu devices of ``optimizer``'s parameters: a tpu
    tensor's storage's (Note [Device index] in frontend/tensor; ``p.device``
    makes a ``torch.device`` per call, 1.3 us a parameter, twice a step), else
    its device's (a DTensor's, whose local shard is on tpu)."""
    found = set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            storage = getattr(p, "_lt_storage", None)
            if storage is not None:
                found.add(storage.graph.index)
            elif p.device.type == "tpu":
                found.add(p.device.index or 0)
    return sorted(found)


def _before_optimizer_step(optimizer, args, kwargs) -> None:
    """The start of ``optimizer.step()`` ends a step's backward segment (Note
    [Step segments] in engine)."""
    if torch.compiler.is_compiling():
        return
    for index in _optimizer_devices(optimizer):
        context(index).segment()


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    """The end of ``optimizer.step()`` is a sync point: the same programs every
    step even in a loop that never reads a value (asynchronous: it does not
    wait; dispatched at the next op, Note [Step boundary] in engine)."""
    if not _config.SYNC_ON_OPTIMIZER_STEP.get():
        return
    for index in _optimizer_devices(optimizer):
        context(index).end_step()  # Note [Step boundary] in engine


def _factory(op):
    """A factory whose kernel for every backend calls a CPU/CUDA-only stub
    (``kaiser_window``): resolved like any other op instead."""
    return lambda *args, **kwargs: dispatch(op, args, kwargs)


def _copy_from(src, dst, non_blocking=False):
    """Cross-device copy, reached with the Python key excluded (e.g. inside
    ``torch.tensor(data, device="tpu")``)."""
    from lazytpu.frontend.routes.handlers import copy_

    return copy_(aten.copy_.default, (dst, src), {})


def _copy_from_and_resize(src, dst):
    from lazytpu.frontend.routes.views import resize_to

    if dst.device.type == "tpu":
        resize_to(dst, src.shape)
    else:
        dst.resize_(src.shape)
    return _copy_from(src, dst)


def _local_scalar_dense(t):
    """``item()`` reached with the Python key excluded (``torch.tensor([t0, t1])`` of
    0-d tpu tensors): torch's boxed fallback cannot serve an op that has a Python
    kernel under another key (its Meta one), so the op has a kernel of its own."""
    return dispatch(aten._local_scalar_dense.default, (t,), {})


def _set_storage(self, source, *offset_sizes_strides):
    """``set_`` of a storage reached with the Python key excluded (``torch.tensor(t.storage())``), as
    ``_local_scalar_dense``: its Python meta kernel keeps it from the boxed fallback."""
    overload = aten.set_.source_Storage_storage_offset if offset_sizes_strides else aten.set_.source_Storage
    return dispatch(overload, (self, source, *offset_sizes_strides), {})


def _backend_fallback(op, *args, **kwargs):
    """Ops that reach the ``tpu`` backend key without a LazyTensor argument
    (factories such as ``tril_indices(3, 3, device="tpu")``): resolve them
    like any other op."""
    return dispatch(op, args, kwargs)


# Note [Sparse layouts on tpu]: a tpu tensor is strided. Sparse tensors made
# from tpu strided tensors (``to_sparse``, ``sparse_coo_tensor(i, v)``) reach
# lazytpu's kernels and are refused there; but torch's ``.to("tpu")`` of a
# compressed tensor (CSR, CSC, BSR, BSC) moves its members one by one and
# wraps them in C++: it returned a ``SparseCsrtpu`` tensor on which no op ran.
# BackendSelect sends that ``_to_copy`` (and ``torch.empty(layout=...,
# device="tpu")``) by the result's layout and device to the sparse tpu keys,
# where every op refuses with the one error.
_SPARSE_KEYS = ("SparsePrivateUse1", "SparseCsrPrivateUse1")


def _refuse_sparse(op, *args, **kwargs):
    layout = kwargs.get("layout")
    if layout is None:
        tensors = (a for a in args if isinstance(a, torch.Tensor) and a.layout != torch.strided)
        layout = next(tensors, torch.empty(0)).layout
    raise hostio.not_strided(layout)


# Note [DLPack on tpu]: ``torch.to_dlpack`` (the legacy capsule export) is a C
# function that never asks the tensor: for a tpu tensor it exported the
# storage's stand-in pointer, and ``from_dlpack`` of that capsule made a tpu
# tensor that is not a LazyTensor, which failed at every use. It refuses as
# ``Tensor.__dlpack__`` does.
def _to_dlpack(export):
    @functools.wraps(export)
    def to_dlpack(tensor):
        if isinstance(tensor, LazyTensor):
            raise dlpack_refused(tensor)
        return export(tensor)

    return to_dlpack


def _tpu_generator_device(args, kwargs) -> torch.device | None:
    """The tpu device a ``torch.Generator(...)`` call names (the current one for ``"tpu"``), or None."""
    device = args[0] if args else kwargs.get("device")
    if not isinstance(device, (str, torch.device)):
        return None
    try:
        device = torch.device(device)
    except RuntimeError:  # torch.Generator's own error for it
        return None
    if device.type != "tpu":
        return None
    return torch.device("tpu", runtime.platform.index_or_current(device.index))


def _install_tpu_generators() -> None:
    """``torch.Generator(device="tpu")`` makes a ``TpuGenerator`` (Note [tpu
    generators] in lazytpu.frontend.generator): a C type cannot be patched, but
    torch's ``Generator`` is made by a Python metaclass, whose ``__call__`` can."""
    meta = type(torch.Generator)
    if meta is type:  # a torch whose Generator has no metaclass of its own: the tpu device's raises as before
        return
    make = meta.__call__

    def __call__(cls, *args, **kwargs):
        device = _tpu_generator_device(args, kwargs) if cls is torch._C.Generator else None
        if device is not None:
            return TpuGenerator(device)
        return make(cls, *args, **kwargs)

    meta.__call__ = __call__


_registered = []


def register() -> None:
    """Idempotent: rename PrivateUse1 to ``tpu`` and install the factories."""
    if _registered:
        return
    _setup_privateuseone_for_python_backend("tpu", backend_module=tpu, hook=_Hooks(), device_guard=_DeviceGuard())
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("empty.memory_format", _empty, "PrivateUse1")
    lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    lib.impl("arange", lambda end, **kw: _arange(0, end, **kw), "PrivateUse1")
    lib.impl("arange.start", lambda start, end, **kw: _arange(start, end, **kw), "PrivateUse1")
    lib.impl("arange.start_step", _arange, "PrivateUse1")
    for overload in ("default", "periodic", "beta"):
        name = "kaiser_window" if overload == "default" else f"kaiser_window.{overload}"
        lib.impl(name, _factory(getattr(aten.kaiser_window, overload)), "PrivateUse1")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    lib.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
    lib.impl("_local_scalar_dense", _local_scalar_dense, "PrivateUse1")
    lib.impl("set_.source_Storage", _set_storage, "PrivateUse1")
    lib.impl("set_.source_Storage_storage_offset", _set_storage, "PrivateUse1")
    sdpa.register(lib)
    bounds.register(lib)
    handlers.register(lib)
    _registered.append(lib)  # keep the library alive
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_backend_fallback, "PrivateUse1")
    for key in _SPARSE_KEYS:  # Note [Sparse layouts on tpu]
        fallback.fallback(_refuse_sparse, key)
        lib.impl("_to_copy", lambda *args, **kwargs: _refuse_sparse(None, *args, **kwargs), key)
    _registered.append(fallback)
    _registered.extend(autocast.register())
    _registered.append(register_optimizer_step_pre_hook(_before_optimizer_step))
    _registered.append(register_optimizer_step_post_hook(_after_optimizer_step))
    # Host copies of tpu storages are saved tagged with their device and loaded back to tpu
    # (or where map_location says) sharing as they were saved (Note [Checkpoint storages] in
    # frontend/hostio); tpu storages, storage.tpu() and pin_memory() (device/serialization).
    serialization.register(lib)
    # torch.utils.checkpoint's recomputation behind a barrier, with the forward's random state
    # (Note [Recomputation barrier] in device/checkpoint).
    checkpoint.register()
    _install_tpu_generators()
    # torch.accelerator's streams, synchronize and memory functions reach torch.tpu's
    # (Note [Accelerator routing] in device/accelerator).
    accelerator.register()
    # A patch of a torch class, so that ``model.to("tpu")`` keeps
    # Parameters (and tied weights) as CUDA does (Note [Module conversion]).
    torch.nn.Module._apply = keep_parameters(torch.nn.Module._apply)
    module_conversion.install()  # Note [Lazy modules on tpu]
    torch.to_dlpack = torch.utils.dlpack.to_dlpack = _to_dlpack(torch._C._to_dlpack)  # Note [DLPack on tpu]
    # Note [Foreach optimizers]: torch.optim takes its ``foreach`` path only
    # for tensors whose type is listed in these two tables; tpu tensors join
    # them (as DTensor does) so that optimizers default to it on tpu as on
    # CUDA, and each ``_foreach_*`` op records one node (Note [Foreach nodes]).
    for table in (_optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types):
        if LazyTensor not in table:
            table.append(LazyTensor)
    # Note [Backward on the caller's thread]: autograd would run tpu backward
    # ops on a device worker thread. That thread can still be dropping its
    # last references to tpu tensors when the interpreter shuts down, which
    # aborts the process at exit (about one script in two). With device
    # threads off, backward runs on the thread that called it; results are
    # the same, and CPU-only autograd is unaffected (it never used them).
    torch.autograd.set_multithreading_enabled(False)
    backward_errors.install()  # Note [Errors in backward] in lazytpu.device.backward_errors
