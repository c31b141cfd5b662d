"""Dispatch-level handlers: ops that are about where data lives, not math.

Device moves, ``copy_``, ``set_``/``resize_`` and host reads (``item``).
"""

from __future__ import annotations

import math

import jax
import torch
from torch._prims_common import suggest_memory_format
from torch.nn.parameter import UninitializedTensorMixin

from lazytpu import runtime
from lazytpu.engine import DeferredCheck, context
from lazytpu.frontend import hostio
from lazytpu.frontend.checks.overlap import check_overlap
from lazytpu.frontend.record import DECOMPOSITIONS, check_with_meta, handles, record
from lazytpu.frontend.routes.views import check_in_bounds, math_bit_view, resize_to, storage_nbytes
from lazytpu.frontend.schema import functional_of
from lazytpu.frontend.tensor import LazyTensor, contiguous_strides, describe
from lazytpu.frontend.windows import new_tensor, rebind_metadata, view_of, write
from lazytpu.ir import Data, Failed, Output
from lazytpu.ir.source import source_line
from lazytpu.lowering import get_rule

aten = torch.ops.aten


@handles(aten._to_copy.default)
def to_copy(func, args, kwargs):
    (src,) = args
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == "cpu":
        host = hostio.to_cpu(src)
        rest = {k: v for k, v in kwargs.items() if k in ("dtype", "memory_format")}
        return host.to(**rest) if rest else host
    if device is not None and torch.device(device).type == "meta":  # sizes and layout, no data (it stayed on tpu)
        stand_in = torch.empty_strided(src.shape, src.stride(), dtype=src.dtype, device="meta")
        return func(stand_in, **kwargs)
    if type(src) is not LazyTensor:  # cpu -> tpu
        index = _index_of(device)
        moved = hostio.data_from_cpu(src, index)
        out = new_tensor(moved, src.shape, contiguous_strides(src.shape), src.dtype, index)
        dtype = kwargs.get("dtype")
        return out if dtype is None or dtype == src.dtype else aten._to_copy.default(out, dtype=dtype)
    rest = {k: v for k, v in kwargs.items() if k != "device"}
    if device is not None and _index_of(device) != (src.device.index or 0):  # tpu:i -> tpu:j
        src = to_device(src, _index_of(device))
        if not rest or rest == {"dtype": src.dtype}:
            return src
        args = (src,)
    return record(func, args, rest, get_rule(func))


def _index_of(device) -> int:
    return runtime.platform.index_or_current(torch.device(device).index)


def to_device(src: LazyTensor, index: int) -> LazyTensor:
    """A copy of ``src`` on ``tpu:index`` (a sync of ``src``'s device: the
    value moves between devices as a buffer, not inside a program)."""
    if src._lt_windowed:
        src = src.clone(memory_format=torch.contiguous_format)
    if isinstance(src._lt_storage.value, Output):
        ctx = context(src.device.index or 0)
        ctx.flush("device_copy", lane=ctx.lane_of(src._lt_storage))
    value = src._lt_storage.value
    if isinstance(value, Failed):
        raise RuntimeError(f"lazytpu: this tensor's value could not be computed: {value.error}")
    moved = jax.device_put(value.buffer, runtime.platform.device(index))
    return new_tensor(Data(moved, value.aval), src.shape, contiguous_strides(src.shape), src.dtype, index)


@handles(aten.copy_.default)
def copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if isinstance(src, UninitializedTensorMixin):  # a lazy module's .to("tpu"): Note [Lazy modules on tpu]
        src = src.data
    if type(dst) is not LazyTensor and dst.device.type == "tpu":  # made by torch's C++ on a tpu storage
        return _copy_into_storage(dst, src)
    if type(dst) is not LazyTensor:  # tpu -> cpu
        return dst.copy_(hostio.to_cpu(src))
    check_overlap(func, args, kwargs, dst)  # Note [Overlapping writes]
    if type(src) is not LazyTensor:  # cpu -> tpu
        index = dst.device.index or 0
        src = new_tensor(hostio.data_from_cpu(src, index), src.shape, contiguous_strides(src.shape), src.dtype, index)
    elif src.device != dst.device:  # tpu:i -> tpu:j
        src = to_device(src, dst.device.index or 0)
    if tuple(src.shape) != tuple(dst.shape):
        torch.empty(dst.shape, device="meta").copy_(torch.empty(src.shape, device="meta"))  # torch's error if not
        src = aten.expand.default(src, list(dst.shape))
    write(dst, src)
    return dst


@handles(aten._local_scalar_dense.default)
def local_scalar(func, args, kwargs):
    (src,) = args
    return hostio.item(src)


# Note [Deterministic uninitialized memory]: under
# ``torch.use_deterministic_algorithms(True)`` with
# ``torch.utils.deterministic.fill_uninitialized_memory`` (its default), torch
# fills the memory its factories leave uninitialized (``empty``,
# ``empty_like``, ``empty_strided``, ``new_empty``, what ``resize_`` grows)
# with NaN (floating and complex), the largest value (integers) or True
# (bool), so that a read of it is caught; elsewhere tpu's new memory is zeros.
def uninitialized_value(dtype: torch.dtype):
    """The value new memory holds (Note [Deterministic uninitialized memory]), or None when unspecified."""
    if not (torch.are_deterministic_algorithms_enabled() and torch.utils.deterministic.fill_uninitialized_memory):
        return None
    if dtype.is_floating_point or dtype.is_complex:
        return math.nan
    return True if dtype is torch.bool else torch.iinfo(dtype).max


def fill_uninitialized(t):
    value = uninitialized_value(t.dtype)
    return t if value is None else t.fill_(value)


@handles(aten.empty_like.default, aten.new_empty.default, aten.new_empty_strided.default)
def empty_like(func, args, kwargs):
    return fill_uninitialized(record(func, args, kwargs, get_rule(func)))


@handles(aten.resize_.default)
def resize_(func, args, kwargs):
    """torch's ``resize_``: a window at the same offset on the same storage,
    contiguous in ``memory_format`` (channels_last too), which grows (old
    contents first, zeros after) when too small; the same sizes without a
    memory format keep the strides."""
    dst, size = args[0], tuple(args[1])
    memory_format = kwargs.get("memory_format")
    # torch's errors (negative sizes, preserve_format, a rank the format does not fit), and the strides
    strides = tuple(torch.empty(0, device="meta").resize_(size, memory_format=memory_format).stride())
    if size == tuple(dst.shape) and (memory_format is None or tuple(dst.stride()) == strides):
        return dst
    offset, have = dst.storage_offset(), dst._lt_desc.storage_numel
    need = offset + math.prod(size)
    base = dst
    if need > have:
        flat = view_of(dst, (have,), (1,), 0)
        value = uninitialized_value(dst.dtype) or 0  # Note [Deterministic uninitialized memory]
        base = (
            aten.constant_pad_nd.default(flat, [0, need - have], value)
            if have
            else aten.full.default([need], value, dtype=dst.dtype, device=dst.device)
        )
    rebind_metadata(dst, view_of(base, size, strides, offset))
    return dst


@handles(aten.resize.default)
def resize(func, args, kwargs):
    out = aten.clone.default(args[0], memory_format=torch.contiguous_format)
    return resize_(aten.resize_.default, (out, args[1]), {})


@handles(aten.resize_as_.default)
def resize_as_(func, args, kwargs):
    """torch's: ``resize_`` to the template's sizes, in ``memory_format`` when
    given (``preserve_format``: the template's suggested memory format)."""
    template, memory_format = args[1], kwargs.get("memory_format")
    if memory_format == torch.preserve_format:
        memory_format = suggest_memory_format(template)
    return resize_(aten.resize_.default, (args[0], list(template.shape)), {"memory_format": memory_format})


@handles(aten.as_strided_scatter.default)
def as_strided_scatter(func, args, kwargs):
    """torch's: a clone of ``self``'s whole storage, with ``self``'s size,
    strides and offset (``clone_preserve_strides``), and ``src`` written through
    the ``as_strided`` window on that storage. The rule reads the window against
    a contiguous ``self``: the same only for a tensor that is its whole storage."""
    call = dict(zip(("self", "src", "size", "stride", "storage_offset"), args), **kwargs)
    x, src, offset = call["self"], call["src"], call.get("storage_offset")
    if type(x) is not LazyTensor:
        return record(func, args, kwargs, get_rule(func))
    if torch._debug_has_internal_overlap(x) == 1:  # torch clones such a tensor contiguous
        x = aten.clone.default(x, memory_format=torch.contiguous_format)
    offset = x.storage_offset() if offset is None else offset
    n = x._lt_desc.storage_numel
    check_in_bounds(call["size"], call["stride"], offset, x.dtype.itemsize, storage_nbytes(x))
    if not x._lt_windowed and x.is_contiguous():
        return record(func, (x, *args[1:]), kwargs, get_rule(func))
    check_with_meta(func, args, kwargs)  # torch's error on src's size
    whole = aten.clone.default(view_of(x, (n,), (1,), 0))
    out = view_of(whole, x.shape, x.stride(), x.storage_offset())
    view_of(whole, call["size"], call["stride"], offset).copy_(src)
    return out


@handles(aten.equal.default)
def equal(func, args, kwargs):
    """A host read, as in torch: equal sizes, then every element equal."""
    a, b = args
    return tuple(a.shape) == tuple(b.shape) and bool(aten.all.default(aten.eq.Tensor(a, b)).item())


@handles(aten.allclose.default)
def allclose(func, args, kwargs):
    return bool(aten.all.default(aten.isclose.default(*args, **kwargs)).item())


@handles(aten.is_pinned.default)
def is_pinned(func, args, kwargs):
    return False


@handles(aten.set_.source_Tensor)
def set_(func, args, kwargs):
    dst, src = args
    _check_same_device(dst, src)
    rebind_metadata(dst, view_of(src, src.shape, src.stride(), src.storage_offset()))
    return dst


def _check_same_device(dst, source) -> None:
    if source.device != dst.device:
        raise RuntimeError(
            f'Attempted to set the storage of a tensor on device "{dst.device}" to a storage on different device '
            f'"{source.device}".  This is no longer allowed; the devices must match.'
        )


@handles(aten.set_.source_Storage, aten.set_.source_Storage_storage_offset)
def set_storage(func, args, kwargs):
    """``t.set_(storage, ...)`` with a tpu storage (``torch.load``'s rebuild,
    ``storage.copy_``, ``storage.cpu()``): ``t`` becomes a window on what the
    storage holds (Note [tpu storages] in frontend/hostio)."""
    call = dict(zip(("self", "source", "storage_offset", "size", "stride"), args), **kwargs)
    dst, source = call["self"], call["source"]
    _check_same_device(dst, source)
    held = hostio.held_by(source)
    if held is None:
        raise RuntimeError(f"lazytpu: this {source.device} storage was not made by lazytpu and holds no data")
    nbytes, dtype = source.nbytes(), dst.dtype
    offset = call.get("storage_offset", 0)
    size = tuple(call.get("size", (nbytes // dtype.itemsize,)))
    stride = tuple(call.get("stride") or contiguous_strides(size))
    check_in_bounds(size, stride, offset, dtype.itemsize, nbytes)
    storage = hostio.storage_for(held, dtype, nbytes)
    if not hostio.reinterpretable(storage.value.aval.dtype, dtype):
        raise NotImplementedError(
            f"lazytpu: a {dtype} tensor set to a tpu storage that {storage.value.aval.dtype} tensors use"
        )
    rebind_metadata(dst, LazyTensor(storage, describe(size, stride, offset, nbytes // dtype.itemsize, dtype)))
    return dst


def _copy_into_storage(dst, src):
    """``dst.copy_(src)`` for a plain tensor torch's C++ made on a tpu storage (the legacy ``torch.load``
    reads a file into one): into the host bytes while the storage holds them, else into a window on what
    it holds (Note [tpu storages] in frontend/hostio). An empty one has no pointer to know it by."""
    memory = dst.untyped_storage()
    held = hostio.held_by(memory)
    if held is None and not memory.nbytes():
        return dst
    if held is None:
        raise RuntimeError(f"lazytpu: this {dst.device} storage was not made by lazytpu and holds no data")
    if held.storage is None and type(src) is not LazyTensor:
        host = torch.empty(0, dtype=dst.dtype).set_(held.host, dst.storage_offset(), dst.shape, dst.stride())
        host.copy_(src)
        held.fresh = False
        return dst
    dtype, offset, size, stride = dst.dtype, dst.storage_offset(), tuple(dst.shape), dst.stride()
    have = None if held.storage is None else held.storage.value.aval.dtype
    if have not in (None, dtype) and type(src) is not LazyTensor and dst.is_contiguous() and dst.numel():
        # host bytes written in the dtype the storage holds, reinterpreted on the host
        # (the legacy loader writes every storage as bytes, bool ones too)
        start, count = offset * dtype.itemsize, dst.numel() * dtype.itemsize
        if not (start % have.itemsize or count % have.itemsize):
            src = src.to(dtype).expand(size).contiguous().view(torch.uint8).view(have)
            dtype, offset, size, stride = have, start // have.itemsize, (count // have.itemsize,), (1,)
    window = torch.empty(0, dtype=dtype, device=dst.device)
    set_storage(aten.set_.source_Storage_storage_offset, (window, memory, offset, size, stride), {})
    copy_(aten.copy_.default, (window, src), {})
    return dst


# Note [check_errors]: ``linalg.cholesky_ex(A, check_errors=True)`` and the
# other ``_ex`` ops check LAPACK's ``info`` inside their CPU kernels (with
# these names in the message); the rules compute ``info`` only. Such a call
# records the op without the flag and checks its ``info`` as
# ``linalg.cholesky`` does (``linalg_check_errors`` below).
CHECKED_EX = {
    aten.linalg_cholesky_ex.default: "linalg.cholesky_ex",
    aten.linalg_inv_ex.default: "linalg.inv_ex",
    aten.linalg_lu_factor_ex.default: "torch.linalg.lu_factor_ex",
    aten.linalg_ldl_factor_ex.default: "torch.linalg.ldl_factor_ex",
    aten._linalg_solve_ex.default: "torch.linalg.solve_ex",
}


def check_errors_after(func, run, args, kwargs):
    """``run`` the ``_ex`` op ``func`` without ``check_errors``, then torch's check of its ``info``."""
    if not kwargs.get("check_errors"):
        return run(func, args, kwargs)
    out = run(func, args, {**kwargs, "check_errors": False})
    aten._linalg_check_errors.default(out[-1], CHECKED_EX[func], is_matrix=args[0].dim() == 2)
    return out


@handles(aten._linalg_check_errors.default)
def linalg_check_errors(func, args, kwargs):
    """torch's check of LAPACK's ``info``, on its host value: now when ``info``
    is materialized, else after the flush that computes it (Note [Deferred
    checks]), so that ``linalg.inv(A)`` does not cut the program."""
    info = args[0]
    if type(info) is not LazyTensor:
        return func(*args, **kwargs)

    def check():
        func(hostio.to_cpu(info), *args[1:], **kwargs)

    value = info._lt_storage.value
    if type(value) is Output:
        context(info.device.index or 0).defer_check(
            DeferredCheck(check, (value,), "torch." + args[1].removeprefix("torch."), source_line())
        )
    else:
        check()


handles(aten._conj.default, aten._neg_view.default)(math_bit_view)


# Note [Prims views]: the prims that are views of their input run as the aten
# views they stand for (what their CPU kernels call): run as views from their
# meta kernels, ``prims.conj`` left the conjugate bit out and ``prims.imag`` of
# a conjugate view lost its sign (the values came back unconjugated), and
# ``prims.as_strided`` made a copy. Their meta kernels check the arguments first.
_PRIMS_VIEWS = {
    torch.ops.prims.real.default: aten.real.default,
    torch.ops.prims.imag.default: aten.imag.default,
    torch.ops.prims.as_strided.default: aten.as_strided.default,
}


@handles(*_PRIMS_VIEWS)
def prims_view(func, args, kwargs):
    check_with_meta(func, args, kwargs)
    return _PRIMS_VIEWS[func](*args, **kwargs)


@handles(aten._unsafe_view.default)
def unsafe_view(func, args, kwargs):
    """A view sharing its input's storage, as CPU's: composite kernels write
    through one (``kron(out=)``: the out tensor stayed unwritten when it was a
    copy); autograd, above this, took it for a new tensor, as torch does."""
    return aten.view.default(*args, **kwargs)


@handles(torch.ops.prims.conj.default)
def prims_conj(func, args, kwargs):
    check_with_meta(func, args, kwargs)  # "Expected complex dtype in prims.conj" (Note [Prims views])
    return math_bit_view(aten._conj.default, args, kwargs)


# Note [CPU norm statistics]: for a half-precision input, CPU torch's layer
# and batch norm kernels save the mean and inverse std in the input's dtype
# (the meta kernels, as CUDA's, say float32), and batch norm outside training
# saves none (empty tensors). With float32 parameters (weight, bias, running
# statistics: the one mix of dtypes CPU's norms take, the kernel check raises
# for the others) they save float32 ones, group norm too (a meta fix in
# ``metas.FIXES``: its meta kernel says the input's dtype). CPU torch is the
# reference: the op runs as usual (rule or decomposition), then its
# statistics are cast or emptied.
_NORM_TRAINING_ARG = {
    aten.native_layer_norm.default: None,
    aten.native_batch_norm.default: 5,
    aten._native_batch_norm_legit.default: 5,
    aten._native_batch_norm_legit.no_stats: 3,
    aten._batch_norm_with_update.default: None,
}


def _half_with_float_parameters(x, args, kwargs) -> bool:
    if x.dtype not in (torch.bfloat16, torch.float16):
        return False  # the common case, at every call: nothing more to look at
    return any(isinstance(a, torch.Tensor) and a.dtype == torch.float32 for a in (*args[1:], *kwargs.values()))


@handles(*_NORM_TRAINING_ARG)
def norm_statistics(func, args, kwargs):
    """Note [CPU norm statistics]."""
    x, position = args[0], _NORM_TRAINING_ARG[func]
    mixed = _half_with_float_parameters(x, args, kwargs)
    rule = get_rule(func)
    if rule is not None:
        out = record(func, args, kwargs, rule)
    else:
        check_with_meta(func, args, kwargs)
        out = DECOMPOSITIONS[func](*args, **kwargs)
    dtype = torch.float32 if mixed else x.dtype
    if position is not None and not args[position]:
        stats = [x.new_empty((0,), dtype=dtype) for _ in range(2)]
    else:
        stats = [s if s.dtype == dtype else aten._to_copy.default(s, dtype=dtype) for s in out[1:3]]
    return (out[0], *stats, *out[3:])


@handles(aten.ldexp.Tensor)
def ldexp(func, args, kwargs):
    """CPU's kernel, ``self * pow(2.0, other)``: the power in ``other``'s dtype, rounded
    there (torch's decomposition raises a tensor of ``self``'s dtype, so a bfloat16
    ``other`` gave float32 powers)."""
    check_with_meta(func, args, kwargs)
    call = dict(zip(("self", "other"), args), **kwargs)
    return aten.mul.Tensor(call["self"], aten.pow.Scalar(2.0, call["other"]))


@handles(aten.bincount.default)
def bincount(func, args, kwargs):
    """The output's length is data (``max(x) + 1``): one host read of the
    input's bounds (torch reads them too), then the counting runs on device."""
    call = dict(zip(("self", "weights", "minlength"), args), **kwargs)
    x, weights, minlength = call["self"], call.get("weights"), call.get("minlength", 0)

    def zeros_like_on_cpu(t):
        return None if t is None else torch.zeros(t.shape, dtype=t.dtype)

    try:  # torch's own checks of dtypes, dims, lengths and minlength (zeros pass the data checks)
        dtype = aten.bincount.default(zeros_like_on_cpu(x), zeros_like_on_cpu(weights), minlength).dtype
    except (RuntimeError, NotImplementedError) as exc:
        raise type(exc)(str(exc).replace("_cpu", "_tpu")).with_traceback(None) from None
    length = minlength
    if x.numel():
        lo, hi = hostio.to_cpu(aten.stack.default([aten.min.default(x), aten.max.default(x)]), "data_dependent")
        if lo < 0:
            raise RuntimeError("bincount only supports 1-d non-negative integral inputs.")
        length = max(int(hi) + 1, minlength)
    out = aten.zeros.default([length], dtype=dtype, device=x.device)
    if not x.numel():
        return out
    values = aten.ones_like.default(x, dtype=dtype) if weights is None else aten._to_copy.default(weights, dtype=dtype)
    index = x if x.dtype in (torch.int32, torch.int64) else aten._to_copy.default(x, dtype=torch.int64)
    return aten.index_add.default(out, 0, index, values)


@handles(aten.linalg_lstsq.default)
def linalg_lstsq(func, args, kwargs):
    """gelsd/gelss report residuals of tall systems only when every matrix
    has full rank: one host read of the ranks decides, as torch's kernel does."""
    out = record(func, args, kwargs, get_rule(func))
    a = args[0]
    m, n = a.shape[-2:]
    driver = kwargs.get("driver")
    if driver in ("gelsd", "gelss") and m > n and out[2].numel():
        if not bool(hostio.to_cpu(aten.eq.Scalar(out[2], n), "data_dependent").all()):
            out = (out[0], aten.new_empty.default(out[1], [0]), *out[2:])
    return out


def _host_list(t):
    return (hostio.to_cpu(t, "data_dependent") if type(t) is LazyTensor else t).reshape(-1).tolist()


def _host_lengths(input_lengths, target_lengths) -> tuple[list, list]:
    """CTC's lengths as host lists, as torch's CPU kernel reads them, after
    its check of their dtypes (made before any read)."""
    for name, t in (("input_lengths", input_lengths), ("target_lengths", target_lengths)):
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise RuntimeError(f"{name} must be integral")
    return _host_list(input_lengths), _host_list(target_lengths)


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction=1, zero_infinity=False):
    """torch's ``ctc_loss`` of tensor lengths for ``tpu``, as its C++ runs it
    for CPU and CUDA: the lengths are read to the host, wherever they live, and
    the call goes on as ``ctc_loss.IntList``. Its composite path for tensor
    subclasses would divide the tpu loss by the lengths, which a CPU tensor
    cannot do with a tpu one (installed for AutogradPrivateUse1 by ``register``)."""
    il, tl = _host_lengths(input_lengths, target_lengths)
    return aten.ctc_loss.IntList(log_probs, targets, il, tl, blank, reduction, zero_infinity)


def _matrix_rank_out(functional):
    """``linalg.matrix_rank(..., out=t)``: torch's composite kernel leaves ``t`` unwritten for a tensor
    subclass (under a ``TorchDispatchMode`` on CPU too); here ``t`` is resized and written, after CPU's checks."""

    def kernel(*args, out, **kwargs):
        if out.device != args[0].device:  # CPU's checks, in CPU's order
            raise RuntimeError(
                "torch.linalg.matrix_rank: Expected result and input tensors to be on the same device, but got "
                f"result on {out.device} and input on {args[0].device}"
            )
        if not torch.can_cast(torch.long, out.dtype):
            raise RuntimeError(
                "torch.linalg.matrix_rank: Expected result to be safely castable from Long dtype, but got "
                f"result with dtype {str(out.dtype).removeprefix('torch.').capitalize()}"
            )
        result = functional(*args, **kwargs)
        resize_to(out, result.shape)
        return out.copy_(result)

    return kernel


def _matmul_out(a, b, *, out):
    """``matmul(..., out=t)`` of a batch by a matrix or vector: torch's composite
    kernel reshapes ``t``, writes the reshaped view, then copies it back into
    ``t`` unless ``is_alias_of`` says they share memory, which it never says of
    two tpu tensors (the copy of ``t`` into itself raised the overlap error)."""
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        raise RuntimeError(
            "matmul(): functions with out=... arguments don't support automatic differentiation, but one of the "
            "arguments requires grad."
        )
    folded = a.dim() >= 3 and b.dim() in (1, 2) and a.dtype == b.dtype == out.dtype
    folded = folded and type(a) is type(b) is type(out) is LazyTensor and a.device == b.device == out.device
    if not folded:  # torch's kernel, with its checks (``out`` of another dtype: mm's and addmv's errors)
        return aten.matmul.out._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, a, b, out=out)
    result = torch.matmul(a, b)
    resize_to(out, result.shape)
    return out.copy_(result)


# Note [Sparse gradients]: tpu has no sparse layouts. ``nn.Embedding(sparse=True)``'s and
# ``gather(sparse_grad=True)``'s backward kernels are composite: they built a sparse COO
# tensor, and raised. On tpu they give the dense gradient of the same values (what
# ``to_dense()`` of CPU's gives), which every optimizer but ``SparseAdam`` takes as CPU's
# (``embedding_bag``'s backward is dense already: its lowering ignores ``sparse``).


def _embedding_sparse_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    return aten.embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq)


def _gather_sparse_backward(x, dim, index, grad):
    return torch.zeros_like(x, memory_format=torch.legacy_contiguous_format).scatter_add_(dim, index, grad)


def register(lib) -> None:
    """Install ``ctc_loss``, ``matmul.out``, ``linalg_matrix_rank``'s ``out=`` forms and the
    sparse gradients' kernels (Note [Sparse gradients]) in ``lib`` (device/registration's aten
    library), above autograd's composite kernels."""
    lib.impl("ctc_loss.Tensor", ctc_loss, "AutogradPrivateUse1")
    lib.impl("matmul.out", _matmul_out, "AutogradPrivateUse1")
    lib.impl("embedding_sparse_backward", _embedding_sparse_backward, "AutogradPrivateUse1")
    lib.impl("_gather_sparse_backward", _gather_sparse_backward, "AutogradPrivateUse1")
    for out, functional in (
        ("out", "default"),
        ("out_tol_tensor", "tol_tensor"),
        ("atol_rtol_tensor_out", "atol_rtol_tensor"),
        ("atol_rtol_float_out", "atol_rtol_float"),
    ):
        kernel = _matrix_rank_out(getattr(aten.linalg_matrix_rank, functional))
        lib.impl(f"linalg_matrix_rank.{out}", kernel, "AutogradPrivateUse1")


@handles(aten._ctc_loss.Tensor)
def ctc_loss_lengths(func, args, kwargs):
    lp, targets, il, tl, *rest = args
    return aten._ctc_loss.default(lp, targets, *_host_lengths(il, tl), *rest, **kwargs)


@handles(aten._ctc_loss_backward.Tensor)
def ctc_loss_backward_lengths(func, args, kwargs):
    grad, lp, targets, il, tl, *rest = args
    return aten._ctc_loss_backward.default(grad, lp, targets, *_host_lengths(il, tl), *rest, **kwargs)


@handles(aten.rand.out, aten.randint.out, aten.randint.generator_out, aten.randint.low_out)
@handles(aten.randint.low_generator_out)
def random_factory_out(func, args, kwargs):
    """``torch.rand``/``randint(..., out=t)`` draw as the factory on ``t``'s device does: the same numbers after
    the same seed. (torch's out= forms have no kernel that reaches tpu's random ops: they ran on CPU, drawing
    from the CPU generator.) A factory resizes its out tensor silently."""
    kwargs = dict(kwargs)
    out = kwargs.pop("out")
    drawn = functional_of(func)(*args, **kwargs, dtype=out.dtype, device=out.device)
    resize_to(out, drawn.shape, warn=False)
    write(out, drawn)
    return out


@handles(aten.rrelu_with_noise.default, aten.rrelu_with_noise_.default)
def rrelu_with_noise(func, args, kwargs):
    """``rrelu_with_noise`` writes its ``noise`` argument in training: the
    functional op, then the writes (``rrelu_`` in training: its input's too)."""
    out, noise = aten.rrelu_with_noise_functional.default(*args, **kwargs)
    args[1].copy_(noise)
    return args[0].copy_(out) if func is aten.rrelu_with_noise_.default else out
