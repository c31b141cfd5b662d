"""``Module.to("tpu")`` keeps the module's Parameter objects (Note [Module conversion]).

Note [Module conversion]: on CUDA, ``Module._apply`` (behind ``.to()``,
``.cpu()``, ``.half()``, ``.to_empty()``) converts each Parameter in place,
``param.data = converted``, because CPU and CUDA tensors are shallow-copy
compatible. The user's Parameter objects stay the model's: weights tied by
sharing one Parameter (GPT-2's ``lm_head.weight is transformer.wte.weight``)
stay tied, an optimizer built before the move keeps working, and hooks and
Python attributes (Hugging Face's ``_is_hf_initialized``) survive. A CPU tensor
and a ``LazyTensor`` are not compatible (``TensorImpl`` counts no PrivateUse1
tensor as dense), so torch makes a new Parameter for each module attribute
instead, and a Parameter shared by two modules becomes two.

``keep_parameters`` wraps ``Module._apply`` (``registration.register`` installs it).
After torch's own pass over a module, each Parameter that a conversion to or
from ``tpu`` replaced is swapped back into the old object with
``torch.utils.swap_tensors`` (what torch itself does for traceable wrapper
subclasses), then the old object's attributes and hooks, which the swap leaves
behind, are restored. The next module holding the same Parameter finds it
converted already: ``fn(param)`` returns ``param`` and torch keeps it. Where
``swap_tensors`` refuses (a weak reference to the Parameter, or a live autograd
graph using it) torch's new Parameter stays, as before this wrapper. Under
torch's ``__future__`` conversion flags torch's semantics apply unchanged.

Conversions between ``tpu`` dtypes take torch's in-place path; Note [Setting
.data] makes it rebind the value.

A Parameter of a subclass (``class P(nn.Parameter)``, a library's parameter
class with methods and attributes of its own) stays one: on tpu as ``P``'s
twin (Note [Subclasses of tpu tensors]), which is what ``P(t)`` and
``torch.Tensor._make_subclass(P, t)`` make of a tpu tensor ``t`` (torch's
own ``Parameter.__new__`` marks ``t`` itself a Parameter, of no class of its
own, and ``_make_subclass`` refuses it); back on CPU as ``P``.

Note [Lazy modules on tpu]: on CUDA, ``nn.LazyLinear(3).to("cuda")`` keeps
its parameters uninitialized, now on CUDA (``UninitializedParameter.to``
returns one), and the first forward materializes them there. A tpu tensor is
a ``LazyTensor``, which torch's ``UninitializedParameter`` and
``UninitializedBuffer`` cannot hold, so the tpu twins below are both: torch's
uninitialized class (``is_lazy``, ``materialize``, its errors on use) over a
``LazyTensor`` (the device, and ``materialize``'s ``self.data = ...``), which
they become when materialized. ``keep_parameters`` gives an uninitialized
parameter or buffer that a conversion moves to or from tpu the class of its
new device before torch's pass (whose ``UninitializedBuffer.to("tpu")``
would fail), the Parameter object kept as above; made with ``device="tpu"``
(a lazy module's ``factory_kwargs``, or tpu the default device), torch's
classes give the twins (``install``).
"""

from __future__ import annotations

import functools

import torch
from torch.nn import parameter

from lazytpu.frontend.tensor import LazyTensor, make_subclass, tensor_new, user_state


def _uninitialized_on_tpu(cls, requires_grad: bool, device, dtype):
    empty = torch.empty(0, device="tpu" if device is None else device, dtype=dtype)
    t = LazyTensor.__new__(cls, empty._lt_storage, empty._lt_desc, True)
    t.requires_grad = requires_grad
    return t


class UninitializedParameter(parameter.UninitializedParameter, LazyTensor):
    """torch's ``UninitializedParameter`` on tpu (Note [Lazy modules on tpu])."""

    cls_to_become = LazyTensor  # a tpu Parameter is a LazyTensor marked ``_is_param``

    def __new__(cls, requires_grad=True, device=None, dtype=None):
        t = _uninitialized_on_tpu(cls, requires_grad, device, dtype)
        t._is_param = True
        return t


class UninitializedBuffer(parameter.UninitializedBuffer, LazyTensor):
    """torch's ``UninitializedBuffer`` on tpu (Note [Lazy modules on tpu])."""

    cls_to_become = LazyTensor

    def __new__(cls, requires_grad=False, device=None, dtype=None):
        return _uninitialized_on_tpu(cls, requires_grad, device, dtype)


def _on_tpu(device) -> bool:
    return (torch.get_default_device() if device is None else torch.device(device)).type == "tpu"


def _made_on_tpu(cls, twin):
    """torch's ``cls.__new__``, or ``twin`` where the device is tpu (``nn.LazyLinear(3, device="tpu")``
    makes ``UninitializedParameter(device="tpu")``, which torch's class cannot hold)."""
    make = cls.__new__

    def __new__(kind, requires_grad=cls is parameter.UninitializedParameter, device=None, dtype=None):
        if kind is cls and _on_tpu(device):
            return twin(requires_grad, device, dtype)
        return make(kind, requires_grad, device, dtype)

    return __new__


def _parameter_made_on_tpu(make):
    """torch's ``Parameter.__new__``, giving a subclass's twin of a tpu tensor (Note [Module conversion])."""

    def __new__(cls, data=None, requires_grad=True):
        if cls is not parameter.Parameter and isinstance(data, LazyTensor):
            return make_subclass(cls, data, requires_grad)
        return make(cls, data, requires_grad)

    return __new__


def install() -> None:
    """Make torch's parameter classes give their tpu twins for a tpu device (Note [Lazy modules on tpu],
    Note [Module conversion]), and a subclass's constructors take tpu tensors (``_make_subclass(cls, t)``,
    ``cls(t)``: Note [Subclasses of tpu tensors])."""
    parameter.UninitializedParameter.__new__ = _made_on_tpu(parameter.UninitializedParameter, UninitializedParameter)
    parameter.UninitializedBuffer.__new__ = _made_on_tpu(parameter.UninitializedBuffer, UninitializedBuffer)
    parameter.Parameter.__new__ = _parameter_made_on_tpu(parameter.Parameter.__new__)
    torch.Tensor._make_subclass = staticmethod(make_subclass)
    torch.Tensor.__new__ = tensor_new


def _uninitialized_as(old, new):
    """An uninitialized tensor of ``old``'s kind on ``new``'s device, of ``new``'s dtype."""
    kind = "parameter" if isinstance(old, parameter.UninitializedParameter) else "buffer"
    on_tpu = new.device.type == "tpu"
    cls = {
        ("parameter", True): UninitializedParameter,
        ("parameter", False): parameter.UninitializedParameter,
        ("buffer", True): UninitializedBuffer,
        ("buffer", False): parameter.UninitializedBuffer,
    }[kind, on_tpu]
    return cls(old.requires_grad, new.device, new.dtype)


def _convert_uninitialized(module, fn) -> None:
    """Give ``module``'s uninitialized parameters and buffers that ``fn`` moves
    to or from tpu the class of their new device first (Note [Lazy modules on
    tpu]); torch's pass then finds them converted. Where ``fn`` takes them is
    read from what it makes of an empty tensor like them."""
    for table in (module._parameters, module._buffers):
        for key, old in table.items():
            if not parameter.is_lazy(old):
                continue
            probe = torch.empty(0, dtype=old.dtype, device=old.device)
            with torch.no_grad():
                moved = fn(probe)
            if moved is probe or "tpu" not in (old.device.type, moved.device.type):
                continue
            new = _uninitialized_as(old, moved)
            table[key] = _swapped_into(old, new) if table is module._parameters else new


def _of_class_of(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``new`` as a Parameter of ``old``'s subclass of Parameter, if it has one (Note [Module conversion])."""
    cls = getattr(type(old), "_lt_twin_of", type(old))
    if cls is parameter.Parameter or not issubclass(cls, parameter.Parameter) or isinstance(new, cls):
        return new
    return torch.Tensor._make_subclass(cls, new, new.requires_grad)


def _swapped_into(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``old`` holding ``new``'s tensor, or ``new`` when torch cannot swap them."""
    state = user_state(old)
    try:
        torch.utils.swap_tensors(old, new)
    except RuntimeError:
        return new
    vars(old).update(state)
    # The hook dicts stay on the Python object, but their registration in
    # autograd went with the swapped-out tensor: setting them registers again.
    if old._backward_hooks is not None:
        old._backward_hooks = old._backward_hooks
    if old._post_accumulate_grad_hooks is not None:
        old._post_accumulate_grad_hooks = old._post_accumulate_grad_hooks
    return old


def keep_parameters(apply):
    """Wrap ``Module._apply`` so that conversions to and from ``tpu`` keep Parameters."""

    @functools.wraps(apply)
    def _apply(self, fn, recurse=True):
        future = torch.__future__
        if future.get_overwrite_module_params_on_conversion() or future.get_swap_module_params_on_conversion():
            return apply(self, fn, recurse)
        _convert_uninitialized(self, fn)
        before = dict(self._parameters)
        out = apply(self, fn, recurse)
        params = self._parameters
        for key, old in before.items():
            new = params.get(key)
            if old is None or new is None or new is old:
                continue
            if isinstance(old, LazyTensor) or isinstance(new, LazyTensor):
                params[key] = _swapped_into(old, _of_class_of(old, new))
        return out

    return _apply
