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
from lazytpu.frontend.tensor import CONJ, NEG, LazyTensor, TensorDesc, describe, with_math_bits
from lazytpu.ir import Node, Output, Scalar, Storage
from lazytpu.ir.node import op_sig
from lazytpu.ir.template import Slot, Template
from lazytpu.lowering.strided import VIEW_READ, VIEW_WRITE, fits_box, overlaps_itself


def new_tensor(value, shape, stride, dtype, index: int) -> LazyTensor:
    """A tensor owning a fresh storage that holds ``value``."""
    numel = 1
    for d in shape:
        numel *= d
    return new_tensor_of(value, describe(shape, stride, 0, numel, dtype), index)


def new_tensor_of(value, desc: TensorDesc, index: int) -> LazyTensor:
    """A tensor of ``desc`` (a base layout) owning a fresh storage of ``value``."""
    return LazyTensor(Storage(value, context(index).graph, desc.stride), desc, True)


def view_of(base: LazyTensor, shape, stride, offset: int) -> LazyTensor:
    """A new tensor sharing ``base``'s storage through another window."""
    desc = describe(shape, stride, offset, base._lt_desc.storage_numel, base.dtype)
    return LazyTensor(base._lt_storage, desc)


def view_dtype(t: LazyTensor):
    """``t``'s dtype when it differs from its storage's (Note [Dtype views]), else None."""
    dtype = t.dtype
    if dtype is t._lt_storage.value.aval.dtype or dtype is torch.complex32:  # complex32 is stored as complex64
        return None
    return dtype


# Note [Window offsets]: a window's offset into its storage is a lifted number
# (Note [Scalar lifting] in lazytpu.ir.node), its size and strides are static:
# ``t[:, k]`` or ``cache[:, pos]`` read in a loop over ``k`` compiles a program
# for its first offset and one more for the second, then every offset reuses
# that one (it compiled one program per offset: PyTorch's test_sort on tpu
# read 2,049 columns at a compile each). An offset of 0 (most views: a
# transpose, a reshape, ``x[:n]``) stays static, an input less per view.


def _window_kwargs(t: LazyTensor, offset_slot: int) -> tuple:
    d = t._lt_desc
    dtype = view_dtype(t)
    offset = Slot(offset_slot) if d.offset else 0  # Note [Window offsets]
    kwargs = (("base_stride", t._lt_storage.stride), ("offset", offset), ("size", d.shape), ("stride", d.stride))
    if dtype is not None:
        kwargs = (kwargs[0], ("dtype", dtype), *kwargs[1:])
    bits = t._lt_bits  # Note [Math bits]: applied after a read, before a write
    if bits & CONJ:
        kwargs = (kwargs[0], ("conj", True), *kwargs[1:])
    if bits & NEG:
        kwargs = (*kwargs[:2], ("neg", True), *kwargs[2:])
    base = t._lt_storage.value.aval
    if dtype is None and fits_box(base.shape, t._lt_storage.stride, d.shape, d.stride, d.offset):
        kwargs = (kwargs[0], ("box", True), *kwargs[1:])  # Note [Box windows]
    return kwargs


_WINDOW_PLANS = _caches.memo("window_plans")
# Keyed by interned descriptors' identities: cleared with them (Note [Memo bound]).


def _window_plan(op, t: LazyTensor) -> tuple:
    """The template, output avals and interned signature of ``op`` (a read
    or a write) on ``t``'s window (Note [Plans] in lazytpu.frontend.record:
    a view's read or write is planned once per layout, not built and hashed
    again per call)."""
    storage = t._lt_storage
    base = storage.value.aval
    key = (op, t._lt_desc, storage.stride, base, t._lt_bits)
    plan = _WINDOW_PLANS.get(key)
    if plan is None:
        read = op is VIEW_READ
        args = (Slot(0),) if read else (Slot(0), Slot(1))
        template = Template(args, _window_kwargs(t, len(args)))
        avals = (t._lt_desc.aval if read else base,)
        plan = _WINDOW_PLANS[key] = (template, avals, op_sig(op, template, avals))
    return plan


def read(t: LazyTensor):
    """The IR value of ``t`` now (pending or materialized)."""
    storage = t._lt_storage
    base = storage.value
    if not t._lt_windowed:
        return base
    cache = t._lt_cache
    if cache is not None and cache[0] is base:
        return cache[1]
    ctx = context(storage.graph.index)
    with ctx.graph.lock:
        template, avals, sig = _window_plan(VIEW_READ, t)
        offset = t._lt_desc.offset
        node = Node(VIEW_READ, template, (base, Scalar(offset)) if offset else (base,), avals, None, sig)
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
    if t._lt_windowed:  # the graph cap, by count and by depth (x[i] = v in a loop is a chain of writes)
        value = t._lt_storage.value
        context(t._lt_storage.graph.index).flush_if_due(depth=value.node.depth if type(value) is Output else 0)


def write_value(t: LazyTensor, value, graph=None) -> None:
    """Make ``t`` hold the IR ``value`` (already of ``t``'s shape and dtype),
    recorded in ``graph`` (default: the calling thread's; an op writing many
    targets passes the one it found).

    Never flushes: an op binding several outputs flushes once all are bound
    (``recorded``; Note [Donation]).
    """
    storage = t._lt_storage
    if not t._lt_windowed:
        storage.bind(value, graph or context(storage.graph.index).graph)
        return
    ctx = context(storage.graph.index)
    with ctx.lock:
        template, avals, sig = _window_plan(VIEW_WRITE, t)
        offset = t._lt_desc.offset
        inputs = (storage.value, value, Scalar(offset)) if offset else (storage.value, value)
        node = Node(VIEW_WRITE, template, inputs, avals, None, sig)
        storage.bind(Output(node, 0), graph or ctx.graph)
        # a window sharing locations reads back what the write resolved, not ``value`` (Note [Overlapping writes])
        t._lt_cache = None if overlaps_itself(t._lt_desc.shape, t._lt_desc.stride) else (storage.value, value)
        ctx.recorded(node, flush=False)


def rebind_metadata(t: LazyTensor, fresh: LazyTensor) -> None:
    """Give ``t`` the size, strides, offset and storage of ``fresh`` (for
    ``resize_``, ``set_`` and in-place view ops such as ``t_``). Its conjugate
    and negative bits stay (Note [Math bits]), as CPU's metadata-only change
    keeps them (``.data =`` takes ``fresh``'s, which a new view has not)."""
    bits = t._lt_bits
    with torch.no_grad():
        t.data = fresh
    t._lt_storage = fresh._lt_storage
    t._lt_desc = fresh._lt_desc
    t._lt_windowed = fresh._lt_windowed
    t._lt_cache = None
    if bits:
        with_math_bits(t, bits)
