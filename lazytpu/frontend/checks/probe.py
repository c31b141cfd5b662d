"""The one CPU probe: a recorded call run on torch stand-ins of its tensors.

Note [CPU probes]: some of torch's checks live only in its CPU kernels (meta
kernels skip them or word them differently), and some facts of a call only
a kernel knows (its output metas). Every check that needs one of those runs
the call here, on stand-ins of the call's tensor values, and reads what it
raised; the caller decides which errors to re-raise and memoizes the probe
per call signature.

- ``stand_in=None`` (the default): each tensor's own layout (shape, strides,
  offset) on a zero storage of the storage's size, where tensors sharing a
  storage share one (an overlap check sees the overlap); on ``meta`` the
  storages are empty.
- ``stand_in=f``: ``f(v)`` for each tensor value (a check of scalars cuts
  large tensors down; a dtype check tries one element, then none).

Lifted scalars take their values. A ``tpu`` device argument becomes the
probe's device. A probe runs under ``no_grad`` and leaves the CPU generator
as it found it (a random op draws on its stand-ins).
"""

from __future__ import annotations

import torch

from lazytpu.frontend.tensor import LazyTensor, is_tpu_device
from lazytpu.ir import Scalar
from lazytpu.ir.template import Template, fill, flatten


def _lazy(leaf):
    return leaf if type(leaf) is LazyTensor else None


def split(args, kwargs) -> tuple[Template, list]:
    """A call as a template and its LazyTensor values (everything else static)."""
    return flatten(args, kwargs, _lazy)


def same_layouts(values, device: str = "cpu") -> list:
    """Stand-ins of ``values`` with their layouts (Note [CPU probes]):
    zeros on CPU (an error must not depend on what uninitialized memory
    holds: a mask's count, a class index), empty on meta."""
    new = torch.zeros if device == "cpu" else torch.empty
    storages: dict = {}
    for v in values:
        if type(v) is LazyTensor:
            nbytes = v._lt_desc.storage_numel * v.dtype.itemsize
            storages[id(v._lt_storage)] = max(storages.get(id(v._lt_storage), 0), nbytes)
    buffers = {k: new(-(-n // 16) * 16, dtype=torch.uint8, device=device) for k, n in storages.items()}
    out = []
    for v in values:
        if type(v) is Scalar:
            out.append(v.value)
        elif type(v) is LazyTensor:
            out.append(buffers[id(v._lt_storage)].view(v.dtype).as_strided(v.shape, v.stride(), v.storage_offset()))
        else:  # a CPU tensor beside tpu ones (a 0-d operand)
            out.append(torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device).zero_())
    return out


def _on(x, device: str):
    return device if is_tpu_device(x) else x


def run_on(func, template: Template, values, device: str = "cpu", stand_in=None):
    """``func``'s result on ``device`` (``"meta"`` or ``"cpu"``) with stand-ins
    of ``values``; raises what the kernel raises."""
    if stand_in is None:
        leaves = same_layouts(values, device)
    else:
        leaves = [v.value if type(v) is Scalar else stand_in(v) for v in values]
    args, kwargs = fill(template, leaves)
    args = tuple(_on(a, device) for a in args)
    if "device" in kwargs:
        kwargs["device"] = _on(kwargs["device"], device)
    with torch.no_grad():
        if device != "cpu":
            return func(*args, **kwargs)
        with torch.random.fork_rng(devices=[]):
            return func(*args, **kwargs)


def cpu_error(func, template: Template, values, stand_in=None) -> tuple[type, str] | None:
    """The type and message of what ``func`` raises on CPU stand-ins, or
    None. Not the exception itself: its traceback would hold the caller's
    frames, and with them the recorded tensors, until a garbage collection
    (they would stay live, and be program outputs, at the next sync)."""
    try:
        run_on(func, template, values, "cpu", stand_in)
    except Exception as exc:  # noqa: BLE001 - the callers choose what to re-raise
        return type(exc), str(exc)
    return None


def cpu_probe(func, args, kwargs) -> tuple[type, str] | None:
    """``cpu_error`` of a call given as ``(args, kwargs)`` with LazyTensors in it."""
    return cpu_error(func, *split(args, kwargs))


def tensor_leaves(x) -> list:
    """The LazyTensors in a nest of lists, tuples and dicts."""
    if type(x) is LazyTensor:
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in tensor_leaves(y)]
    if isinstance(x, dict):
        return tensor_leaves(list(x.values()))
    return []
