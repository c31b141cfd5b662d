"""View ops: outputs that are windows on their input's storage, planned once per call signature."""

from __future__ import annotations

import warnings

import torch

from lazytpu import _caches
from lazytpu.frontend.metas import infer_meta
from lazytpu.frontend.record import HANDLERS, pick, plan_key
from lazytpu.frontend.tensor import CONJ, NEG, LazyTensor, describe, with_math_bits
from lazytpu.frontend.windows import rebind_metadata, view_of
from lazytpu.ir.template import flatten

aten = torch.ops.aten


_VIEW_PLANS = _caches.memo("view_plans")


def run_view(func, args, kwargs):
    """A view op: the outputs share the input's storage (no node is recorded).

    Returns None when torch's "view" changes the dtype to or from bool or
    complex32: those are computed as values instead. The output
    descriptions are planned once per call signature (Note [Plans]).
    """
    src = args[0]
    if src._lt_bits:
        _check_math_bits(func, src._lt_bits)
    plan = _window_plan(func, src._lt_desc, args, kwargs)
    if plan is None:
        key, _ = plan_key(func, args, kwargs)
        plan = _VIEW_PLANS.get(key)
        if plan is None:
            plan = _VIEW_PLANS[key] = _make_view_plan(func, args, kwargs, src)
    if plan is False:
        return None
    descs, container = plan
    storage = src._lt_storage
    if torch.is_inference_mode_enabled() and not src.is_inference():
        with torch.inference_mode(False):  # Note [Views in inference mode]
            out = _views(storage, descs, container)
    else:
        out = _views(storage, descs, container)
    bits = src._lt_bits
    if bits:  # the views of a tensor with math bits carry them (Note [Math bits])
        for t in (out,) if container is None else out:
            with_math_bits(t, bits)
    return out


def math_bit_view(func, args, kwargs):
    """``_conj()`` and ``_neg_view()``: an alias of the input with its
    conjugate (negative) bit flipped (Note [Math bits])."""
    src = args[0]
    bits = src._lt_bits ^ (CONJ if func is aten._conj.default else NEG)
    desc = (src._lt_desc,)
    if torch.is_inference_mode_enabled() and not src.is_inference():
        with torch.inference_mode(False):  # Note [Views in inference mode]
            return with_math_bits(_views(src._lt_storage, desc, None), bits)
    return with_math_bits(_views(src._lt_storage, desc, None), bits)


_BIT_ERRORS = {
    (aten.view_as_real.default, CONJ): "view_as_real doesn't work on unresolved conjugated tensors.  To resolve the "
    "conjugate tensor so you can view it as real, use self.resolve_conj(); however, be warned that the resulting "
    "tensor will NOT alias the original.",
    (aten.view.dtype, CONJ): "torch.Tensor.view is not supported for conjugate view tensors when converting to a "
    "different dtype.",
    (aten.view.dtype, NEG): "torch.Tensor.view is not supported for tensors with negative bit set when converting "
    "to a different dtype.",
}


def _check_math_bits(func, bits: int) -> None:
    """torch's checks of views that cannot carry a math bit (raised, as on CPU, even for the same dtype)."""
    for bit in (CONJ, NEG):
        message = _BIT_ERRORS.get((func, bit)) if bits & bit else None
        if message is not None:
            raise RuntimeError(message)


def _views(storage, descs, container):
    """The view tensors of a plan on ``storage``.

    Note [Views in inference mode]: under ``torch.inference_mode()`` a view of
    a normal tensor is a normal tensor sharing its base's version counter (torch
    sets it on the view it gets back, and refuses to on an inference tensor); a
    view of an inference tensor is one. So the view of a normal tensor is made
    with inference mode off.
    """
    if container is None:
        return LazyTensor(storage, descs[0])
    return container(LazyTensor(storage, d) for d in descs)


# Note [Index windows]: ``x[i]`` and ``x[a:b]`` in a loop make a view per
# index, and an index is part of a plan's call signature: each new one ran
# the meta kernel (a loop over a million-element mask read one element in
# 250 µs, against 2 µs on CPU). ``select`` and ``slice`` of an index in range
# compute their window as torch's kernels do (``select_symint``,
# ``slice``: drop or narrow the dim, move the offset); any other call (a
# dim or index out of range, a step of 0) is planned, and raises torch's error.


def _select(desc, dim, index):
    ndim = len(desc.shape)
    if not -ndim <= dim < ndim:
        return None
    dim %= ndim
    size = desc.shape[dim]
    if not -size <= index < size:
        return None
    index %= size
    drop = dim + 1
    return (desc.shape[:dim] + desc.shape[drop:], desc.stride[:dim] + desc.stride[drop:], index * desc.stride[dim])


def _slice(desc, dim=0, start=None, end=None, step=1):
    ndim = len(desc.shape)
    if not -ndim <= dim < ndim or type(step) is not int or step <= 0:
        return None
    dim %= ndim
    size = desc.shape[dim]
    start = 0 if start is None else start + size if start < 0 else start
    end = size if end is None else end + size if end < 0 else end
    start = min(max(start, 0), size)
    end = min(max(end, start), size)
    shape = (*desc.shape[:dim], (end - start + step - 1) // step, *desc.shape[dim + 1 :])
    stride = (*desc.stride[:dim], desc.stride[dim] * step, *desc.stride[dim + 1 :])
    return shape, stride, start * desc.stride[dim]


_INDEX_WINDOWS = {aten.select.int: _select, aten.slice.Tensor: _slice}


def _window_plan(func, desc, args, kwargs):
    """The plan of a ``select`` or ``slice`` of ints in range (Note [Index windows]), or None."""
    window = _INDEX_WINDOWS.get(func)
    if window is None or kwargs or not desc.shape or any(type(a) not in (int, type(None)) for a in args[1:]):
        return None
    found = window(desc, *args[1:])
    if found is None:
        return None
    shape, stride, moved = found
    return (describe(shape, stride, desc.offset + moved, desc.storage_numel, desc.dtype),), None


def _make_view_plan(func, args, kwargs, src):
    template, values = flatten(args, kwargs, pick)
    meta_out = infer_meta(func, template, values)
    metas = [meta_out] if isinstance(meta_out, torch.Tensor) else list(meta_out)
    if any(m.dtype != src.dtype and not _reinterpretable(func, src.dtype, m.dtype) for m in metas):
        return False
    nbytes = src._lt_desc.storage_numel * src.dtype.itemsize
    held = storage_nbytes(src)
    for m in metas:
        check_in_bounds(m.shape, m.stride(), m.storage_offset(), m.dtype.itemsize, held)
    descs = tuple(describe(m.shape, m.stride(), m.storage_offset(), nbytes // m.dtype.itemsize, m.dtype) for m in metas)
    if isinstance(meta_out, torch.Tensor):
        return descs, None
    return descs, tuple if isinstance(meta_out, tuple) else list


def _span(size, stride) -> int:
    """Elements from a window's first to its last, both included (0 if empty)."""
    return 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0


def storage_nbytes(t) -> int:
    """The bytes of ``t``'s storage: as its desc says, or more where the
    storage's base is laid out with gaps (``empty_strided((2, 3), (7, 8))``
    spans 24 elements, not 6)."""
    storage = t._lt_storage
    aval = storage.value.aval
    spanned = max(storage.numel, _span(aval.shape, storage.stride)) * aval.dtype.itemsize
    return max(t._lt_desc.storage_numel * t.dtype.itemsize, spanned)


def check_in_bounds(size, stride, offset: int, itemsize: int, nbytes: int) -> None:
    """torch's error for a window past the end of its storage (``as_strided``;
    meta storages have no size, so their kernels never raise it)."""
    if 0 in size:
        return
    need = (offset + _span(size, stride)) * itemsize
    if need > nbytes:
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, and itemsize "
            f"{itemsize} requiring a storage size of {need} are out of bounds for storage of size {nbytes}"
        )


_NOT_REINTERPRETED = frozenset({torch.complex32})
# Views that reinterpret their input's bytes; others whose schema may alias (``to.dtype``)
# convert when the dtype changes.
_REINTERPRETING = frozenset({aten.view.dtype, aten.view_as_real.default, aten.view_as_complex.default})


def _reinterpretable(func, src: torch.dtype, dst: torch.dtype) -> bool:
    """A dtype-changing view is a window on its base's storage (Note [Dtype views]),
    except for complex32 (stored as complex64): those are computed as values."""
    return func in _REINTERPRETING and src not in _NOT_REINTERPRETED and dst not in _NOT_REINTERPRETED


def run_inplace_view(func, args, kwargs):
    self = args[0]
    template, values = flatten(args, kwargs, pick)
    meta = infer_meta(func, template, values)
    rebind_metadata(self, view_of(self, meta.shape, meta.stride(), meta.storage_offset()))
    return self


def resize_to(dst: LazyTensor, shape, *, warn: bool = True) -> None:
    """Give ``dst`` a new shape as torch's ``resize_output`` does for ``out=``: ``resize_``
    (a contiguous window at the same offset of the same storage), with its warning."""
    shape = tuple(shape)
    if tuple(dst.shape) == shape:
        return
    if warn and dst.numel() != 0:
        warnings.warn(
            f"An output with one or more elements was resized since it had shape {list(dst.shape)}, "
            f"which does not match the required output shape {list(shape)}. This behavior is deprecated, "
            "and in a future PyTorch release outputs will not be resized unless they have zero elements. "
            "You can explicitly reuse an out tensor t by resizing it, inplace, to zero elements with "
            "t.resize_(0).",
            UserWarning,
            stacklevel=4,
        )
    HANDLERS[aten.resize_.default](aten.resize_.default, (dst, list(shape)), {})
