"""The floor of an eager backend in Python: a tensor subclass that only forwards.

Note [Forwarding floor]: lazytpu is a ``__torch_dispatch__`` wrapper subclass,
so every op of an eager step pays torch's Python-subclass dispatch (the
dispatcher's Python key, the call into ``__torch_dispatch__``, unwrapping the
arguments, making a wrapper per output) before lazytpu does anything of its
own. ``ForwardingTensor`` pays exactly that and nothing else: it unwraps its
arguments, runs the op on the CPU tensors inside and wraps the results. A
workload on it (the ``subclass`` variant of the suite, ``device="subclass"``
in ``benchmarks.workloads``) is the fastest any eager backend built this way
can run the step, with CPU torch doing the compute; ``subclass/cpu`` is the
ceiling of ``defer/cpu`` (Note [Ceilings] in ``benchmarks.report``).
"""

from __future__ import annotations

import torch

DEVICE = "subclass"  # the pseudo device name the workload factories take


class ForwardingTensor(torch.Tensor):
    """A CPU tensor behind a wrapper subclass (Note [Forwarding floor])."""

    __slots__ = ("inner",)

    @staticmethod
    def __new__(cls, inner: torch.Tensor, requires_grad: bool = False):
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            inner.shape,
            strides=inner.stride(),
            storage_offset=inner.storage_offset(),
            dtype=inner.dtype,
            device=inner.device,
            requires_grad=requires_grad,
        )
        out.inner = inner
        return out

    def __repr__(self) -> str:
        return f"ForwardingTensor({self.inner!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        inner_args = [_unwrap(a) for a in args]  # flat: a list argument holds tensors at most one deep
        inner_kwargs = {k: _unwrap(v) for k, v in kwargs.items()} if kwargs else {}
        out = func(*inner_args, **inner_kwargs)
        if type(out) is torch.Tensor:
            return args[0] if args and out is inner_args[0] else cls(out)  # in-place: its first argument
        if isinstance(out, (tuple, list)):
            return type(out)(cls(o) if type(o) is torch.Tensor else o for o in out)
        return out


def _unwrap(value):
    if type(value) is ForwardingTensor:
        return value.inner
    if type(value) in (list, tuple):
        return [v.inner if type(v) is ForwardingTensor else v for v in value]
    return value


def wrap(value):
    """``value`` (a tensor or a module) on the forwarding subclass."""
    if isinstance(value, torch.nn.Module):
        return _wrap_module(value)
    return ForwardingTensor(value.detach(), requires_grad=value.requires_grad)


def _wrap_module(module: torch.nn.Module) -> torch.nn.Module:
    """Each parameter and buffer replaced by a wrapped one (tied ones stay tied;
    ``Module._apply`` would set a Parameter's ``.data`` to the wrapper instead)."""
    done: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for table, make in ((sub._parameters, _parameter), (sub._buffers, wrap)):
            for name, t in table.items():
                if t is not None:
                    if id(t) not in done:
                        done[id(t)] = make(t)
                    table[name] = done[id(t)]
    return module


def _parameter(p: torch.nn.Parameter) -> torch.nn.Parameter:
    return torch.nn.Parameter(ForwardingTensor(p.detach()), p.requires_grad)
