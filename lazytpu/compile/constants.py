"""Tensor constants made while tracing: ``torch.tensor(data, device="tpu")``
under a ``FakeTensorMode`` (Note [Lifting tpu constants]).

Note [Lifting tpu constants]: ``torch.tensor(data, device=d)`` builds a real
tensor with the Python dispatch key excluded, then ``aten::lift_fresh``es
it, so that a tracing mode sees the new constant. CPU torch's
``FakeTensorMode`` avoids making device tensors when no device is present:
it builds the tensor on CPU, lifts it and moves it with ``.to(d)`` (NOTE:
[torch.tensor, lift_fresh, and device movement] in torch's tensor_new.cpp).
With ``tpu`` present it does not, so dynamo's and AOTAutograd's tracing
makes a real ``tpu`` tensor, and the fake mode declines to lift a tensor
subclass it does not know: the op lands here, and the real tensor would
then meet fake ones (``pick``'s error in frontend/record). So ``lift_fresh`` of a
``tpu`` tensor under a fake mode does what torch does without a device: it
lifts a CPU copy (a fake CPU constant, in a traced graph a
``_tensor_constant`` holding real CPU data) and moves that with ``.to``
(a fake ``tpu`` tensor, in a traced graph a ``_to_copy``), both through the
current modes. The copy is read with every mode off: under
AOTAutograd's functionalization even the host read would be traced.
Outside a fake mode ``lift_fresh`` stays the alias it is.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import _disable_current_modes

from lazytpu.frontend import hostio
from lazytpu.frontend.record import handles
from lazytpu.frontend.routes.views import run_view

aten = torch.ops.aten

_FAKE = torch._C._TorchDispatchModeKey.FAKE


@handles(aten.lift_fresh.default)
def lift_fresh(func, args, kwargs):
    """``lift_fresh`` of a ``tpu`` tensor: under a fake mode, a CPU copy lifted
    and moved (Note [Lifting tpu constants]); else an alias."""
    if torch._C._get_dispatch_mode(_FAKE) is None:
        return run_view(func, args, kwargs)
    (t,) = args
    with _disable_current_modes():
        host = hostio.to_cpu(t)  # its value came from the host: no program runs
    return func(host).to(t.device)


# Note [No tpu constants in fake mode]: a fake tensor keeps the real value of
# a small constant (``torch.tensor(0)``) and computes ops on all-constant
# inputs for real, with Python dispatch off (``no_dispatch``). Moving such a
# constant with ``.to(tpu)`` made a real tpu tensor its constant; the next op
# on it (Mamba's cache ``c.add_(n)``, DETR's ``num_boxes / world_size``) then
# ran with lazytpu's dispatch off, where no kernel exists, and failed dynamo's
# trace with "func != nullptr INTERNAL ASSERT FAILED". A tpu result is never
# made a constant: the op is traced as any other, as for a device without
# real tensors under tracing.
_may_turn_const = FakeTensorMode.may_turn_const


def _may_turn_const_off_tpu(self, t) -> bool:
    return t.device.type != "tpu" and _may_turn_const(self, t)


FakeTensorMode.may_turn_const = _may_turn_const_off_tpu
