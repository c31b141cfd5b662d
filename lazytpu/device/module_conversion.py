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
"""

from __future__ import annotations

import functools

import torch

from lazytpu.frontend.tensor import LazyTensor, user_state


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
        before = dict(self._parameters)
        out = apply(self, fn, recurse)
        future = torch.__future__
        if future.get_overwrite_module_params_on_conversion() or future.get_swap_module_params_on_conversion():
            return out
        params = self._parameters
        for key, old in before.items():
            new = params.get(key)
            if old is None or new is None or new is old:
                continue
            if isinstance(old, LazyTensor) or isinstance(new, LazyTensor):
                params[key] = _swapped_into(old, new)
        return out

    return _apply
