"""``LazyTensor``: the torch tensor type of the ``tpu`` device.

A wrapper subclass: torch sees its size, strides, dtype and device; its value
lives in a shared ``Storage`` (Note [Storage]) holding device data or a
pending IR value. Every op on it arrives in ``__torch_dispatch__``.
"""

from __future__ import annotations

import copy
from collections import OrderedDict

import torch
import torch.fx.experimental.proxy_tensor as _proxy_tensor

from lazytpu import _caches
from lazytpu.frontend.storages import DeviceStorage, TpuStorage, device_storage, storage_address, tag_storage
from lazytpu.ir import Aval, Storage

_DEVICES: dict[int, torch.device] = {}


class Backend:
    """What the tensor type calls into, installed once (``install``).

    Note [Tensor backend]: the tensor type sits below the modules that record
    ops and move data (they import it), yet ``__torch_dispatch__``, ``tolist``
    and ``torch.save`` need them. Rather than importing upward, the tensor
    type has one install point: ``lazytpu.frontend.dispatch`` installs the
    resolver and the host transfers when it is
    imported, and routes that re-enter the resolver call ``redispatch``.
    """

    __slots__ = ("dispatch", "to_cpu", "saved_storage")

    def __init__(self) -> None:
        self.dispatch = self.to_cpu = self.saved_storage = None


BACKEND = Backend()


def is_tpu_device(d) -> bool:
    """Whether ``d`` (a ``torch.device`` or a string) names a ``tpu`` device."""
    return (isinstance(d, torch.device) and d.type == "tpu") or (isinstance(d, str) and d.startswith("tpu"))


def install(**parts) -> dict:
    """Install the backend's parts (Note [Tensor backend]); returns the
    parts they replace, so that a tool can wrap one and restore it."""
    previous = {}
    for name, fn in parts.items():
        previous[name] = getattr(BACKEND, name)  # AttributeError for a part that does not exist
        setattr(BACKEND, name, fn)
    return previous


def redispatch(func, args, kwargs):
    """Resolve ``func`` as if torch had dispatched it (Note [Resolution order])."""
    return BACKEND.dispatch(func, args, kwargs)


def tpu_device(index: int = 0) -> torch.device:
    dev = _DEVICES.get(index)
    if dev is None:
        dev = _DEVICES[index] = torch.device("tpu", index)
    return dev


def contiguous_strides(shape) -> tuple[int, ...]:
    strides, n = [], 1
    for d in reversed(tuple(shape)):
        strides.append(n)
        n *= max(d, 1)
    return tuple(reversed(strides))


class TensorDesc:
    """What torch knows of a tensor besides its data: size, strides, offset,
    dtype, and the element count of its storage (``storage_numel``, in
    elements of ``dtype``; ``nbytes`` is what ``untyped_storage().nbytes()``
    reports: that count's bytes, or more for a window past it).

    Interned (``describe``): equal descriptions are the same object, so they
    hash and compare by identity — the meta-kernel memo key of a call is a
    tuple of these, cheap to build and to look up.
    """

    __slots__ = ("shape", "stride", "offset", "storage_numel", "dtype", "aval", "nbytes", "plain", "__weakref__")

    def __init__(self, shape, stride, offset, storage_numel, dtype, aval) -> None:
        self.shape, self.stride, self.offset = shape, stride, offset
        self.storage_numel, self.dtype, self.aval = storage_numel, dtype, aval
        span = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if all(shape) else 0
        self.nbytes = max(storage_numel, offset + span) * dtype.itemsize
        # the layout torch gives a wrapper made from sizes alone: contiguous, at 0, storage its own size
        self.plain = offset == 0 and stride == contiguous_strides(shape) and self.nbytes == span * dtype.itemsize

    def __repr__(self) -> str:
        return f"TensorDesc({list(self.shape)}, stride={self.stride}, offset={self.offset}, {self.dtype})"


_DESCS = _caches.memo("tensor_descriptors", limit=2 * _caches.MEMO_SIZE)
# Cleared with the plans keyed by these descriptors' identities (dispatch): a
# tensor made before the clear keeps its old descriptor, which then just misses.
# A forgotten descriptor (Note [Memo bound]) misses the same way; it is kept
# twice as long as a plan, so plans rarely outlive the descriptors they are keyed by.


def describe(shape, stride, offset: int, storage_numel: int, dtype: torch.dtype) -> TensorDesc:
    """The interned ``TensorDesc`` of these properties."""
    key = (tuple(shape), tuple(stride), offset, storage_numel, dtype)
    desc = _DESCS.get(key)
    if desc is None:
        desc = _DESCS[key] = TensorDesc(key[0], key[1], offset, storage_numel, dtype, Aval(key[0], dtype))
    return desc


# The instance attributes that make up a LazyTensor's value (the rest of its
# ``__dict__`` is the user's, or torch's ``_is_param`` mark).
REPRESENTATION = ("_lt_storage", "_lt_desc", "_lt_windowed", "_lt_cache", "_lt_bits")
_NOT_USER_STATE = frozenset(REPRESENTATION) | {"_is_param"}
_TENSOR_DATA = torch._C.TensorBase.data

# Note [Math bits]: CPU torch's ``conj()`` of a complex tensor is a view with
# the conjugate bit set, and ``.imag`` of such a view one with the negative
# bit: its values are the conjugate (the negation) of its base's, read and
# written through it. A tpu tensor keeps its bits in ``_lt_bits`` (CONJ,
# NEG), set with torch's own by ``with_math_bits``, and is always a window
# (``_lt_windowed``): reading it applies the bits after the window
# (``lazytpu.lowering.strided.view_read``), writing it applies them before
# (``view_write``), so every op that reads or writes through ``read`` and
# ``write`` sees the logical values. torch's Conjugate and Negative fallbacks
# resolve a tensor with a bit by ``clone`` before any op that is not listed
# as handling the bits itself; the views of a tensor with bits carry its bits
# (``lazytpu.frontend.routes.views``), as torch's view kernels carry them in
# the dispatch key set.
CONJ, NEG = 1, 2


def with_math_bits(t: LazyTensor, bits: int) -> LazyTensor:
    """``t`` with the math bits ``bits`` (Note [Math bits]); a tensor with
    none keeps its window."""
    if bits or t._lt_bits:
        if bits:
            t._lt_bits = bits
            t._lt_windowed = True
        else:
            del t._lt_bits
        t._lt_cache = None
        torch._C._set_conj(t, bool(bits & CONJ))
        torch._C._set_neg(t, bool(bits & NEG))
    return t


def alias(t: LazyTensor) -> LazyTensor:
    """A new tensor on ``t``'s storage, window and math bits."""
    return with_math_bits(LazyTensor(t._lt_storage, t._lt_desc, not t._lt_windowed), t._lt_bits)


# Note [Deep copies]: ``copy.deepcopy`` of a tpu tensor copies its storage
# once per ``deepcopy`` call (the memo is keyed by the storage, as torch keys
# it by the storage's ``_cdata``): views of one base in the original are
# views of one base in the copy, and a tensor met twice is copied once. The
# copy is a new ``Storage`` bound to the same IR value, which is immutable:
# nothing is computed or moved, a pending value stays pending (computed once,
# for both), and a write to either storage re-binds only that one. The copy
# keeps the window, ``requires_grad``, ``.grad`` (copied) and the Python
# attributes. A Parameter is copied as ``Parameter.__deepcopy__`` copies one
# on CPU and CUDA: its data cloned, ``requires_grad`` kept, no ``.grad`` and
# no attributes. torch's own ``Tensor.__deepcopy__`` would clone the tensor
# alone (a wrapper subclass has no data pointer), then try to deep-copy the
# storage's lock.


_UNTYPED_STORAGE = torch._C.TensorBase.untyped_storage


def _copied_storage(storage: Storage) -> Storage:
    """A new storage holding ``storage``'s value (Note [Deep copies])."""
    with storage.graph.lock:
        return Storage(storage.value, storage.graph, storage.stride)


def _unwraps_itself(t: type) -> bool:
    """A tensor subclass met in an op that handles the op by unwrapping
    itself (torch.distributed's ``AsyncCollectiveTensor``, ``DTensor``, a
    user's wrapper): ``__torch_dispatch__`` returns ``NotImplemented`` to let
    it, as torch's protocol asks. Tracing modes' tensors (``FakeTensor``) are
    not such; recording them raises a clear error instead."""
    return not issubclass(t, LazyTensor) and not t.__module__.startswith("torch._subclasses")


def _plain(tree):
    """``tree`` with each tensor of a subclass of ``LazyTensor`` replaced by a
    ``LazyTensor`` on its storage (the routes take exactly ``LazyTensor``)."""
    if isinstance(tree, LazyTensor) and type(tree) is not LazyTensor:
        return alias(tree)
    if type(tree) in (tuple, list):
        return type(tree)(_plain(x) for x in tree)
    if type(tree) is dict:
        return {k: _plain(v) for k, v in tree.items()}
    return tree


def user_state(t: torch.Tensor) -> dict:
    """The Python attributes a user (or a library, e.g. Hugging Face's
    ``_is_hf_initialized``) set on ``t``: what ``param.data = new`` keeps."""
    return {k: v for k, v in vars(t).items() if k not in _NOT_USER_STATE}


def dlpack_refused(t) -> BufferError:
    """The error of every DLPack export of a tpu tensor."""
    return BufferError(
        f"can't export a {t.device} device type tensor through DLPack. "
        "Use Tensor.cpu() to copy the tensor to host memory first."
    )


class LazyTensor(torch.Tensor):
    """A tensor on the ``tpu`` device whose value may still be pending."""

    _lt_storage: object  # the shared Storage (Note [Storage]); its graph's ``index`` is the device's
    _lt_desc: TensorDesc
    _lt_windowed: bool = False  # whether ``_lt_desc`` is a window on the storage, not its base layout
    _lt_cache: tuple | None = None  # (storage value, value read through the window)
    _lt_bits: int = 0  # CONJ | NEG (Note [Math bits])

    @staticmethod
    def __new__(cls, storage, desc: TensorDesc | None = None, is_base: bool | None = None, requires_grad=None):
        if type(storage) is not Storage:  # ``type(param)(data, requires_grad)`` of a tpu Parameter (accelerate)
            return torch.nn.Parameter(storage, requires_grad if requires_grad is not None else desc in (None, True))
        # Note [Device index]: a tensor's device is its storage's: the index is kept
        # once, by the storage's graph (one per device and thread), and read from there
        device = tpu_device(storage.graph.index)
        if desc.plain:  # the common case, about 0.5 us less of torch's argument parsing
            t = torch.Tensor._make_wrapper_subclass(cls, desc.shape, dtype=desc.dtype, device=device)
        else:
            t = torch.Tensor._make_wrapper_subclass(
                cls,
                desc.shape,
                strides=desc.stride,
                dtype=desc.dtype,
                device=device,
                storage_offset=desc.offset,
                storage_size=desc.nbytes,  # a view's storage is its base's, as on CPU
            )
        t._lt_storage = storage
        t._lt_desc = desc
        if is_base is None:
            aval = storage.value.aval  # a view of another dtype is never the base (Note [Dtype views])
            is_base = (
                desc.offset == 0
                and desc.stride == storage.stride
                and desc.shape == aval.shape
                and (desc.dtype is aval.dtype or desc.dtype is torch.complex32)
            )
        if not is_base:
            t._lt_windowed = True
        return t

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def data(self):
        return _TENSOR_DATA.__get__(self)

    @data.setter
    def data(self, new) -> None:
        # Note [Setting .data]: torch's ``set_data`` swaps size, strides and
        # dtype but knows nothing of the Python-side value, so ``t.data =
        # new`` (also ``Module._apply``'s in-place conversion, e.g. ``.half()``
        # of a tpu model) takes ``new``'s storage and window too.
        # torch refuses ``set_data`` between tensors of other dispatch keys: the
        # math bits (Note [Math bits]) are cleared around it, then set as ``new``'s
        if self._lt_bits:
            with_math_bits(self, 0)
        bits = getattr(new, "_lt_bits", 0)
        _TENSOR_DATA.__set__(self, new if not bits else LazyTensor(new._lt_storage, new._lt_desc, False))
        own = vars(self)
        for name in REPRESENTATION:
            if name in vars(new):
                own[name] = getattr(new, name)
            else:
                own.pop(name, None)
        with_math_bits(self, bits)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if len(types) > 1 and any(_unwraps_itself(t) for t in types):
            return NotImplemented  # its own __torch_dispatch__ unwraps it, then calls us again
        if cls is not LazyTensor:  # an uninitialized parameter on tpu (Note [Lazy modules on tpu] in module_conversion)
            args, kwargs = _plain((args, kwargs or {}))
        # inside backward, an error raised here is taken by the device guard and
        # raised by backward() (Note [Errors in backward] in lazytpu.device.backward_errors)
        return BACKEND.dispatch(func, args, kwargs or {})

    def __deepcopy__(self, memo):
        """``copy.deepcopy``, as torch's for a tensor with storage (Note [Deep copies])."""
        if not self.is_leaf:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol at the "
                "moment.  If you were attempting to deepcopy a module, this may be because of a "
                "torch.nn.utils.weight_norm usage, see https://github.com/pytorch/pytorch/pull/103001"
            )
        copied = memo.get(id(self))
        if copied is not None:
            return copied
        if vars(self).get("_is_param"):
            new = self._copied_parameter()
            memo[id(self)] = new
            return new
        storage = self._lt_storage
        entry = memo.get(id(storage))
        if entry is None:
            memo[id(storage)] = entry = (storage, _copied_storage(storage))  # holding it keeps its id from reuse
        new = LazyTensor(entry[1], self._lt_desc, not self._lt_windowed)
        if self._lt_bits & CONJ:  # as torch's Tensor.__deepcopy__: the copy's values, without the bits
            new = torch.ops.aten.conj_physical.default(new)
        if self._lt_bits & NEG:
            new = torch.ops.aten.neg.default(new)
        if self.requires_grad:
            new.requires_grad_()
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        own = vars(new)
        for name, value in vars(self).items():
            if name not in REPRESENTATION:
                own[name] = copy.deepcopy(value, memo)
        memo[id(self)] = new
        return new

    def _copied_parameter(self) -> LazyTensor:
        """``Parameter.__deepcopy__``: a clone of the data, with ``requires_grad``
        and nothing else (no ``.grad``, no attributes), as on CPU."""
        if self._lt_windowed:
            with torch.no_grad():
                new = self.detach().clone(memory_format=torch.preserve_format)
        else:
            new = LazyTensor(_copied_storage(self._lt_storage), self._lt_desc, True)
        new.requires_grad_(self.requires_grad)
        new._is_param = True
        return new

    def data_ptr(self) -> int:
        """See Note [Data pointers]: the storage's address plus this tensor's offset in bytes
        (0 for a tensor of no elements, as on CPU)."""
        if not self.numel():
            return 0
        return storage_address(self._lt_storage) + self.storage_offset() * self.element_size()

    def untyped_storage(self) -> torch.UntypedStorage:
        """torch's ``untyped_storage()``: for a view, its base's (sizes as on CPU;
        the data pointer of Note [Data pointers]), readable
        through the storage's methods (Note [tpu storages] in frontend/hostio)."""
        memory = _UNTYPED_STORAGE(self)
        if type(memory) is not TpuStorage:
            memory.__class__ = TpuStorage  # its resize_ (Note [Storage resize])
        held = device_storage(memory)
        if held is None or held.storage is not self._lt_storage:
            tag_storage(memory, DeviceStorage(self._lt_storage, None, self._lt_storage.graph.index))
        return memory

    def numpy(self, *, force: bool = False):
        if force:  # torch's contract: detached, on the host, math bits resolved
            return self.detach().cpu().numpy(force=True)
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first."
        )

    def __dlpack__(self, *args, **kwargs):
        """DLPack shares memory, and a tpu tensor's memory is not a pointer a
        consumer can read (its storage's data pointer is a stand-in): refused,
        as ``numpy()`` is, instead of a capsule of garbage (``to_dlpack`` and
        ``__dlpack_device__`` too)."""
        raise dlpack_refused(self)

    def __dlpack_device__(self):
        raise dlpack_refused(self)

    def __reduce_ex__(self, protocol):
        """``torch.save``: a sync point; saved as torch saves a CUDA tensor, a
        window on a host copy of its storage tagged with its device, which
        ``torch.load`` restores on tpu (or where ``map_location`` says),
        sharing that storage with the tensors saved with it as on CPU (Note
        [Checkpoint storages] in frontend/hostio). A Parameter is rebuilt as
        one, with its attributes, as ``Parameter.__reduce_ex__`` does (hooks
        are not saved); another tensor's attributes are restored as torch
        restores a CUDA tensor's. A tensor with math bits is saved as its
        values: CPU torch keeps the bits and the sharing with its base."""
        state = user_state(self)
        if isinstance(self, torch.nn.Parameter):
            data = (self.detach(), self.requires_grad, OrderedDict())
            if not state:
                return torch._utils._rebuild_parameter, data
            return torch._utils._rebuild_parameter_with_state, (*data, state)
        if self._lt_bits:  # saved as its values (Note [Math bits]), not as a window with bits on its base's storage
            values = torch.ops.aten.clone.default(self)
            vars(values).update(state)
            return values.__reduce_ex__(protocol)
        memory = torch.storage.TypedStorage(wrap_storage=BACKEND.saved_storage(self), dtype=self.dtype, _internal=True)
        args = (memory, self.storage_offset(), tuple(self.shape), self.stride(), self.requires_grad, OrderedDict())
        if state:
            return torch._tensor._rebuild_from_type_v2, (torch._utils._rebuild_tensor_v2, torch.Tensor, args, state)
        return torch._utils._rebuild_tensor_v2, args

    def __copy__(self):
        """``copy.copy``: as on CPU, a tensor on the same storage (what torch's
        pickling protocol would make of one on the host copy is a CPU tensor)."""
        new = alias(self)
        if self.requires_grad:
            new.requires_grad_()
        vars(new).update((k, v) for k, v in vars(self).items() if k not in REPRESENTATION)
        return new

    def as_subclass(self, cls):
        """``Tensor.as_subclass`` (Note [Subclasses of tpu tensors])."""
        twin = _subclass_twin(cls)
        if twin is None:  # not a tensor class, or a wrapper of its own: torch's errors
            return _AS_SUBCLASS(self, cls)
        out = torch.ops.aten.alias.default(self)  # as torch's: a view that autograd tracks
        out.__class__ = twin
        return out

    def tolist(self):
        return BACKEND.to_cpu(self, reason="tolist").tolist()

    def __array__(self, dtype=None, copy=None):
        return self.numpy()

    def __format__(self, format_spec: str) -> str:
        """A 0-d tensor formats as its number (``f"{loss:.4f}"``), a ``Parameter`` or a subclass's not, as in torch."""
        if self.dim() == 0 and type(self) is LazyTensor and not getattr(self, "_is_param", False):
            return self.detach().item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __repr__(self, *, tensor_contents=None) -> str:
        from torch._tensor_str import _str, _tensor_str

        with torch.no_grad(), torch._C.DisableTorchFunctionSubclass():  # a plain host tensor for a subclass too
            host = self.detach().cpu()
        plain = _str(host)
        contents = _tensor_str(host, len("tensor("))
        head = "tensor(" + contents
        rest = plain[len(head) : -1] if plain.startswith(head) else ""
        if type(self) is not LazyTensor:  # a subclass's name (Note [Subclasses of tpu tensors])
            head = f"{type(self).__name__}({_tensor_str(host, len(type(self).__name__) + 1)}"
        suffix = f", device='{self.device}'" + rest
        if self.grad_fn is not None:
            suffix += f", grad_fn=<{type(self.grad_fn).__name__}>"
        elif self.requires_grad:
            suffix += ", requires_grad=True"
        if type(self) is not LazyTensor and isinstance(self, torch.nn.Parameter):
            return f"Parameter({head}{suffix}))"  # within Parameter.__repr__'s, as torch's for a subclass
        prefix = "Parameter containing:\n" if getattr(self, "_is_param", False) else ""  # torch's Parameter's
        return prefix + head + suffix + ")"


# Note [Subclasses of tpu tensors]: ``t.as_subclass(cls)`` makes a ``cls``
# object on ``t``'s tensor; a tpu tensor is already the Python object
# ``LazyTensor``, so torch's refuses it ("already associated to a python
# object"), and with it every library that wraps tensors in a subclass of its
# own (torchvision's ``tv_tensors``: ``BoundingBoxes``, ``Mask``, ``Image``).
# On tpu the result is an alias of ``t`` of ``cls``'s twin: a class deriving
# from ``cls`` and ``LazyTensor`` (isinstance of both, named as ``cls``), with
# ``cls``'s ``__torch_function__``, so its ops wrap their results as ``cls``'s
# do on CPU, and ``LazyTensor``'s ``__torch_dispatch__``. ``as_subclass(torch.Tensor)``
# gives a plain tpu tensor. A class with a ``__torch_dispatch__`` of its own (a
# wrapper subclass) cannot be both, and keeps torch's error.
# ``torch.Tensor._make_subclass(cls, t, requires_grad)``, by which a class
# wraps a tensor in its ``__new__`` (``nn.Parameter`` for a CPU tensor, the
# Parameter subclasses of libraries: ``class P(nn.Parameter)``), makes a
# detached alias of the twin on tpu likewise; a twin of a Parameter subclass
# is saved as a tpu Parameter is (torch rebuilds a ``P`` as a ``Parameter``).
# ``cls(t)`` is ``t.as_subclass(cls)``, as on CPU.
_AS_SUBCLASS = torch.Tensor.as_subclass
_MAKE_SUBCLASS = torch.Tensor._make_subclass
_TENSOR_NEW = torch._C.TensorBase.__new__
_TWINS: dict[type, type] = {}  # a user's class: its twin (whose ``_lt_twin_of`` is that class)


def _subclass_twin(cls) -> type | None:
    if not isinstance(cls, type) or not issubclass(cls, torch.Tensor):
        return None
    if cls is torch.Tensor:
        return LazyTensor
    if issubclass(cls, LazyTensor):  # a twin, or lazytpu's own
        return cls
    if cls.__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        return None
    twin = _TWINS.get(cls)
    if twin is None:
        own = {"__module__": cls.__module__, "_lt_twin_of": cls}
        if cls.__reduce_ex__ is torch.nn.Parameter.__reduce_ex__:
            own["__reduce_ex__"] = LazyTensor.__reduce_ex__
        twin = type(cls.__name__, (cls, LazyTensor), own)
        twin.__qualname__ = cls.__qualname__
        # set after: torch disables it in a class with a __torch_dispatch__
        if cls.__torch_function__ is not torch._C._disabled_torch_function_impl:  # (as Parameter's is)
            twin.__torch_function__ = classmethod(_twin_torch_function)
        _TWINS[cls] = twin
    return twin


def _make_subclass_arguments(cls, data, require_grad=False):
    return cls, data, require_grad


# Both replacements take ``*args``: torch.compile checks that a function it
# traces in its own way has the signature of torch's, or none.
def make_subclass(*args, **kwargs):
    """``torch.Tensor._make_subclass(cls, data, require_grad=False)`` (Note [Subclasses of tpu tensors])."""
    try:
        cls, data, require_grad = _make_subclass_arguments(*args, **kwargs)
    except TypeError:  # torch's other arguments (and its errors)
        return _MAKE_SUBCLASS(*args, **kwargs)
    twin = _subclass_twin(cls) if isinstance(data, LazyTensor) else None
    if twin is None:
        return _MAKE_SUBCLASS(*args, **kwargs)
    out = torch.ops.aten.detach.default(data)  # as torch's: sharing its version counter
    out.__class__ = twin
    with torch._C.DisableTorchFunctionSubclass():  # torch's sets it under no __torch_function__
        return out.requires_grad_(bool(require_grad))


def tensor_new(*args, **kwargs):
    """``torch.Tensor.__new__(cls, ...)``: ``cls(t)`` (Note [Subclasses of tpu tensors])."""
    if len(args) == 2 and not kwargs and isinstance(args[1], LazyTensor) and args[0] is not torch.Tensor:
        return args[1].as_subclass(args[0])
    return _TENSOR_NEW(*args, **kwargs)


def _twin_torch_function(twin, func, types, args=(), kwargs=None):
    """``cls``'s ``__torch_function__``, given ``cls`` where the call has its
    twin: results are wrapped as ``cls`` (a tpu one as the twin, by
    ``as_subclass``; one on another device, from ``.cpu()``, as ``cls`` itself)."""
    originals = tuple(getattr(t, "_lt_twin_of", t) for t in types)
    return twin._lt_twin_of.__torch_function__(func, originals, args, kwargs)


# Note [Type name]: errors name an argument by its type's ``__name__`` ("must be tuple of Tensors, not
# Tensor"); a tpu tensor's is CPU's, its qualified name (by which pickle finds it) LazyTensor.
LazyTensor.__name__ = "Tensor"

# Note [Traced as a tensor]: ``make_fx`` (and so ``torch.func.linearize``) traces
# a call only when every tensor in it is a plain tensor or one it tracks; for a
# subclass it returns NotImplemented and leaves the op to the subclass's
# ``__torch_dispatch__``, under the still-active tracer. A tpu tensor the traced
# function closes over (tracked inputs pass) then ran lazytpu's dispatch, the
# meta work of its shape inference was traced instead of the op, and the result
# was baked into the graph as a constant: the graph ignored its inputs. A
# ``LazyTensor`` is a device tensor, not a tensor-like protocol: traced as CPU's
# tensors are, a closed-over one is a constant of the graph and the op is traced.
_proxy_tensor.HANDLED_TYPES = (*_proxy_tensor.HANDLED_TYPES, LazyTensor)
