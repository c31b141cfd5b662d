"""Reading and writing tensors through their windows on a shared storage.

Every ``tpu`` tensor is a (size, stride, offset) window on a ``Storage``
(Note [Storage]); views share their base's storage. ``read`` gives a tensor's
current value (recording a ``view_read`` when it is a view), ``write``
replaces it (recording a ``view_write`` into the base when it is a view), so
a write through any view is seen by the base and by every other view.
"""

from __future__ import annotations

import torch

from lazytpu import _caches
from lazytpu.engine import context
from lazytpu.ir import Aval, Node, Output, Storage
from lazytpu.ir.template import Slot, Template
from lazytpu.lowering.views import VIEW_READ, VIEW_WRITE, overlaps_itself
from lazytpu.tensor import LazyTensor, TensorDesc, describe


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, n = [], 1
    for d in reversed(tuple(shape)):
        strides.append(n)
        n *= max(d, 1)
    return tuple(reversed(strides))


def new_tensor(value, shape, stride, dtype, index: int) -> LazyTensor:
    """A tensor owning a fresh storage that holds ``value``."""
    numel = 1
    for d in shape:
        numel *= d
    return new_tensor_of(value, describe(shape, stride, 0, numel, dtype), index)


def new_tensor_of(value, desc: TensorDesc, index: int) -> LazyTensor:
    """A tensor of ``desc`` (a base layout) owning a fresh storage of ``value``."""
    return LazyTensor(Storage(value, context(index).graph, desc.stride), desc, index, True)


def view_of(base: LazyTensor, shape, stride, offset: int) -> LazyTensor:
    """A new tensor sharing ``base``'s storage through another window."""
    desc = describe(shape, stride, offset, base._lt_desc.storage_numel, base.dtype)
    return LazyTensor(base._lt_storage, desc, base.device.index or 0)


def view_dtype(t: LazyTensor):
    """``t``'s dtype when it differs from its storage's (Note [Dtype views]), else None."""
    dtype = t.dtype
    if dtype is t._lt_storage.value.aval.dtype or dtype is torch.complex32:  # complex32 is stored as complex64
        return None
    return dtype


def _window_kwargs(t: LazyTensor) -> tuple:
    size, stride, offset = t._lt_window
    dtype = view_dtype(t)
    kwargs = (("base_stride", t._lt_storage.stride), ("offset", offset), ("size", size), ("stride", stride))
    return kwargs if dtype is None else (kwargs[0], ("dtype", dtype), *kwargs[1:])


def _node(op, inputs: tuple, kwargs: tuple, aval: Aval) -> Node:
    template = Template(tuple(Slot(i) for i in range(len(inputs))), kwargs)
    return Node(op, template, inputs, (aval,))


def read(t: LazyTensor):
    """The IR value of ``t`` now (pending or materialized)."""
    storage = t._lt_storage
    base = storage.value
    if t._lt_window is None:
        return base
    cache = t._lt_cache
    if cache is not None and cache[0] is base:
        return cache[1]
    ctx = context(t.device.index or 0)
    with ctx.graph.lock:
        node = _node(VIEW_READ, (base,), _window_kwargs(t), Aval(tuple(t.shape), t.dtype))
        value = Output(node, 0)
        t._lt_cache = (base, value)
        ctx.recorded(node, flush=False)  # no storage holds ``value``: its consumer flushes
    return value


def write(t: LazyTensor, src: LazyTensor) -> None:
    """Make ``t`` hold ``src``'s value (cast and broadcast to ``t``)."""
    if src.dtype != t.dtype:
        src = torch.ops.aten._to_copy.default(src, dtype=t.dtype)
    if src.shape != t.shape:
        src = torch.ops.aten.expand.default(src, list(t.shape))
    write_value(t, read(src))
    if t._lt_window is not None:
        context(t.device.index or 0).flush_if_due()


def write_value(t: LazyTensor, value) -> None:
    """Make ``t`` hold the IR ``value`` (already of ``t``'s shape and dtype).

    Never flushes: an op binding several outputs flushes once all are bound
    (``recorded``; Note [Donation]).
    """
    storage = t._lt_storage
    ctx = context(t.device.index or 0)
    if t._lt_window is None:
        storage.bind(value, ctx.graph)
        return
    with ctx.lock:
        node = _node(VIEW_WRITE, (storage.value, value), _window_kwargs(t), storage.value.aval)
        storage.bind(Output(node, 0), ctx.graph)
        size, stride, _ = t._lt_window
        # a window sharing locations reads back what the write resolved, not ``value`` (Note [Overlapping writes])
        t._lt_cache = None if overlaps_itself(size, stride) else (storage.value, value)
        ctx.recorded(node, flush=False)


def rebind_metadata(t: LazyTensor, fresh: LazyTensor) -> None:
    """Give ``t`` the size, strides, offset and storage of ``fresh`` (for
    ``resize_``, ``set_`` and in-place view ops such as ``t_``)."""
    with torch.no_grad():
        t.data = fresh
    t._lt_storage = fresh._lt_storage
    t._lt_desc = fresh._lt_desc
    t._lt_window = fresh._lt_window
    t._lt_cache = None


# -- overlapping writes ---------------------------------------------------------

_OVERLAP_CHECKS = _caches.memo("overlap_checks")


def check_overlap(func, args, kwargs, written: LazyTensor) -> None:
    """Raise torch's error for a write into ``written`` that CPU torch refuses.

    Note [Overlapping writes]: torch refuses a write whose target has elements
    sharing memory (an expanded tensor) or that partially overlaps one of the
    op's inputs ("unsupported operation: ..."), and warns for some of them;
    meta kernels check neither. When the target could overlap (a zero stride,
    or another input on its storage), the op runs on CPU zeros with the same
    layouts and the same storage sharing, and its error is raised (its
    warnings reach the caller as torch's own). The outcome is cached per
    layout, except for a self-overlapping target, whose warnings repeat.
    """
    storage = written._lt_storage
    leaves = _tensor_leaves((args, kwargs))
    shared = any(t is not written and t._lt_storage is storage for t in leaves)
    overlapping = 0 in written.stride() and torch._debug_has_internal_overlap(written) == 1
    if not (shared or overlapping):
        return
    groups = [next(i for i, u in enumerate(leaves) if u._lt_storage is t._lt_storage) for t in leaves]
    key = (func, tuple(t._lt_desc for t in leaves), tuple(groups))
    error = _OVERLAP_CHECKS.get(key, False)
    if error is False:
        error = cpu_probe(func, args, kwargs)
        if not (isinstance(error, RuntimeError) and str(error).startswith("unsupported operation:")):
            error = None
        if not overlapping:
            _OVERLAP_CHECKS[key] = error
    if error is not None:
        raise RuntimeError(str(error))


def _tensor_leaves(x) -> list:
    if type(x) is LazyTensor:
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensor_leaves(y)]
    if isinstance(x, dict):
        return _tensor_leaves(list(x.values()))
    return []


def cpu_probe(func, args, kwargs) -> Exception | None:
    """What ``func`` raises on CPU torch with zeros in tensors of the arguments' layouts
    (tensors sharing a storage share one here too); None when it raises nothing."""
    leaves = _tensor_leaves((args, kwargs))
    groups = [next(i for i, u in enumerate(leaves) if u._lt_storage is t._lt_storage) for t in leaves]
    sizes: dict = {}
    for t, g in zip(leaves, groups):
        sizes[g] = max(sizes.get(g, 0), t._lt_desc.storage_numel * t.dtype.itemsize)
    buffers = {g: torch.zeros(-(-n // 16) * 16, dtype=torch.uint8) for g, n in sizes.items()}
    proxies = {
        id(t): buffers[g].view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())
        for t, g in zip(leaves, groups)
    }

    def cpu(x):
        if type(x) is LazyTensor:
            return proxies[id(x)]
        if isinstance(x, (list, tuple)):
            return type(x)(cpu(y) for y in x)
        if isinstance(x, torch.device) or (isinstance(x, str) and x.startswith("tpu")):
            return torch.device("cpu")
        return x

    try:
        with torch.no_grad():
            func(*cpu(tuple(args)), **{k: cpu(v) for k, v in kwargs.items()})
    except Exception as exc:  # noqa: BLE001 - the caller picks the errors it re-raises
        return exc
    return None
