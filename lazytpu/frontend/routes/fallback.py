"""CPU fallback: an op with no lowering, or a data-dependent shape, runs on CPU torch."""

from __future__ import annotations

import warnings

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_non_overlapping_and_dense

from lazytpu import _caches, _config, metrics
from lazytpu.frontend import hostio
from lazytpu.frontend.record import device_index, kwarg_device_index, map_tensors
from lazytpu.frontend.routes.views import resize_to
from lazytpu.frontend.tensor import LazyTensor, contiguous_strides, is_tpu_device
from lazytpu.frontend.windows import new_tensor, write_value
from lazytpu.ir.source import user_stacklevel

aten = torch.ops.aten

_WARNED: set = _caches.table("fallback_warnings", set)


# Note [Data-dependent shapes]: ops whose output shape depends on values
# (nonzero, unique, masked_select, boolean-mask indexing, repeat_interleave
# without output_size) cannot be recorded: the inputs are synced (reason
# "data_dependent"), the op runs where the data now is, and recording goes on
# with its result. This is not a missing lowering, so it is not counted as a
# CPU fallback and works with LAZYTPU_CPU_FALLBACK=0.
DATA_DEPENDENT = frozenset(
    {
        aten.nonzero.default,
        aten.nonzero.out,
        aten.argwhere.default,
        aten.masked_select.default,
        aten._unique2.default,
        aten.unique_dim.default,
        aten.unique_consecutive.default,
        aten._unique.default,
        aten.repeat_interleave.Tensor,
        aten.index.Tensor,
        aten.index_put.default,
        aten.index_put_.default,
    }
)


# Note [Composite kernels on device]: an op torch implements once for every
# backend by calling other ops (a CompositeExplicitAutograd kernel) still
# reaches ``__torch_dispatch__`` first, as the whole op. For the ops listed,
# torch's own kernel runs instead of the CPU one: the ops it calls come back
# here as ``tpu`` ops, and what it makes on the host stays there.
# ``_pack_padded_sequence`` (``pack_padded_sequence``) reads the lengths on
# the host, slices and concatenates the input, and returns ``batch_sizes``
# on the CPU, as torch requires of a ``PackedSequence``.
_COMPOSITE_KERNELS = frozenset({aten._pack_padded_sequence.default})
_COMPOSITE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


def cpu_fallback(func, args, kwargs, *, data_dependent: bool = False):
    """Run ``func`` on CPU torch; copy mutated inputs and results back
    (Note [Composite kernels on device]: or run torch's backend-independent kernel)."""
    if func in _COMPOSITE_KERNELS:
        return func.redispatch(_COMPOSITE, *args, **kwargs)
    name = str(func)
    if data_dependent:
        reason = "data_dependent"
    else:
        if not _config.CPU_FALLBACK.get():
            raise NotImplementedError(
                f"lazytpu: no lowering for {func} and CPU fallback is off (LAZYTPU_CPU_FALLBACK=0)"
            )
        reason = "cpu_fallback"
        metrics.count("cpu_fallbacks", name)
        if name not in _WARNED:
            _WARNED.add(name)
            message = f"lazytpu: {name} has no lowering; it runs on CPU (slower, splits the program)"
            warnings.warn(message, stacklevel=user_stacklevel())
    _check_out_devices(func, args, kwargs)
    lazies: list[LazyTensor] = []
    resized = {id(v) for v in _written(func, args, kwargs)}

    def to_cpu(x):
        lazies.append(x)
        host = hostio.to_cpu(x, reason=reason)
        return host.clone() if id(x) in resized else host  # an out= the op may resize: a storage of its own

    cargs = tuple(map_tensors(a, LazyTensor, to_cpu) for a in args)
    ckwargs = {k: map_tensors(v, LazyTensor, to_cpu) for k, v in kwargs.items()}
    if is_tpu_device(ckwargs.get("device")):
        ckwargs["device"] = "cpu"
    index = device_index(lazies) if lazies else (kwarg_device_index(kwargs) or 0)
    out = func(*cargs, **ckwargs)
    # write mutated arguments back
    written = {}
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            lazy = kwargs.get(arg.name) if arg.kwarg_only else (args[i] if i < len(args) else None)
            host = ckwargs.get(arg.name) if arg.kwarg_only else (cargs[i] if i < len(cargs) else None)
            pairs = zip(lazy, host) if isinstance(lazy, (list, tuple)) else [(lazy, host)]  # Tensor(a!)[] too
            for lazy, host in pairs:
                if type(lazy) is LazyTensor:
                    if tuple(lazy.shape) != tuple(host.shape):
                        resize_to(lazy, host.shape, warn=False)  # the CPU op warned
                    write_value(lazy, hostio.data_from_cpu(host, index))
                    written[id(host)] = lazy

    def back(x):
        if id(x) in written:
            return written[id(x)]
        data = hostio.data_from_cpu(x, index)  # first: it refuses what tpu cannot hold (a nested tensor)
        # CPU's layout where it is dense (nonzero's is column-major)
        stride = x.stride() if is_non_overlapping_and_dense(x) else contiguous_strides(x.shape)
        return new_tensor(data, x.shape, stride, x.dtype, index)

    return map_tensors(out, torch.Tensor, back)


def _check_out_devices(func, args, kwargs) -> None:
    """An ``out=`` tensor off the device of tpu inputs: torch's error (out= ops
    with a lowering check it in ``run_out``); the CPU run would accept it."""
    outs = [kwargs[a.name] for a in func._schema.arguments if a.kwarg_only and a.is_out and a.name in kwargs]
    if not outs or not any(isinstance(a, LazyTensor) for a in args):
        return
    for out in outs:
        for dst in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(dst, torch.Tensor) and type(dst) is not LazyTensor:
                raise RuntimeError(f"Expected out tensor to be on tpu, but found it on {dst.device}")


def _written(func, args, kwargs) -> list:
    """The arguments ``func`` writes (its in-place target, its ``out=``)."""
    out = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            value = kwargs.get(arg.name) if arg.kwarg_only else (args[i] if i < len(args) else None)
            map_tensors(value, LazyTensor, out.append)
    return out
