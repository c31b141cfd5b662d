"""Index bounds checks on the host, on request (``LAZYTPU_DEBUG=bounds``), and ``one_hot``.

Note [Index bounds]: by default an integer index *tensor* is checked inside
its program and the error raised at the next host read (Note [Value checks]
in lazytpu.frontend.checks.value_checks). With ``LAZYTPU_DEBUG=bounds`` every op below
instead snapshots its integer index tensors when recorded and, once they are
computed (at the next flush: Note [Deferred checks]), runs itself on the CPU
with those indices and data-free stand-ins for the other tensors, so that
torch raises its own error (type and message), with the ``file:line`` that
recorded the op. This costs a host read of the indices per op and a
blocking flush: a debugging mode, not a training one.
"""

from __future__ import annotations

import torch

from lazytpu import _config
from lazytpu.engine import DeferredCheck, context, located
from lazytpu.frontend import hostio
from lazytpu.frontend.checks import value_checks
from lazytpu.frontend.checks.probe import run_on, split
from lazytpu.frontend.checks.value_checks import HOST_CHECKED
from lazytpu.frontend.metas import MetaUnavailable
from lazytpu.frontend.record import handles, record
from lazytpu.frontend.routes.fallback import DATA_DEPENDENT, cpu_fallback
from lazytpu.frontend.tensor import LazyTensor
from lazytpu.frontend.windows import read
from lazytpu.ir import Output
from lazytpu.ir.source import location, source_line
from lazytpu.ir.template import Slot, Template
from lazytpu.lowering import get_rule

aten = torch.ops.aten


def enabled() -> bool:
    return "bounds" in _config.DEBUG.value


_INSTALLED: list = []


def install() -> None:
    """Route the checked ops through ``checked`` (idempotent). lazytpu does
    this at import when ``LAZYTPU_DEBUG`` has ``bounds``; otherwise these ops
    stay on dispatch's recorded fast path."""
    if _INSTALLED:
        return
    handles(*HOST_CHECKED)(checked)  # a handler comes first in every op's route
    _INSTALLED.append(True)


def checked(func, args, kwargs):
    """Record ``func``; with bounds checks on, check its indices once computed."""
    try:
        out = record(func, args, kwargs, get_rule(func))
    except MetaUnavailable:
        return cpu_fallback(func, args, kwargs, data_dependent=func in DATA_DEPENDENT)
    if enabled():
        _check_later(func, args, kwargs, out)
    return out


def _is_index(x) -> bool:
    return type(x) is LazyTensor and not x.is_floating_point() and not x.is_complex()


def _map(x, fn):
    if isinstance(x, (list, tuple)):
        return type(x)(_map(y, fn) for y in x)
    return fn(x) if type(x) is LazyTensor else x


def _check_later(func, args, kwargs, out) -> None:
    # snapshots: later in-place writes to an index tensor must not change what this op used
    snap_args = _map(args, lambda t: t.clone() if _is_index(t) else t)
    snap_kwargs = {k: _map(v, lambda t: t.clone() if _is_index(t) else t) for k, v in kwargs.items()}
    where = source_line()

    def stand_in(t):
        if _is_index(t):
            return hostio.to_cpu(t)
        return torch.zeros((), dtype=t.dtype).expand(t.shape)  # no data, no memory

    template, snapshots = split(snap_args, snap_kwargs)

    def check():
        run_on(func, template, snapshots, "cpu", stand_in)

    indices: list = []
    _map((snap_args, list(snap_kwargs.values())), lambda t: indices.append(t) if _is_index(t) else None)
    pending = [t for t in indices if type(t._lt_storage.value) is Output]
    if pending:
        guards: list = []
        _map(out, lambda t: guards.append(t._lt_storage.value) if type(t._lt_storage.value) is Output else None)
        context(pending[0].device.index or 0).defer_check(DeferredCheck(check, tuple(guards), str(func), where))
    else:
        try:
            check()
        except (IndexError, RuntimeError) as exc:
            raise located(exc, str(func), where) from None


def register(lib) -> None:
    """Make ``one_hot`` reach lazytpu (``lib`` is device/registration's aten library):
    torch decomposes it before any backend sees it, unless the backend has
    a kernel of its own."""
    lib.impl("one_hot", lambda x, num_classes=-1: one_hot(aten.one_hot.default, (x, num_classes), {}), "PrivateUse1")


@handles(aten.one_hot.default)
def one_hot(func, args, kwargs):
    """``one_hot`` as torch computes it for CUDA (``eq`` against an
    ``arange``; ``num_classes=-1`` reads the largest class, a sync), with
    CPU torch's checks of the classes as value checks (Note [Value checks])."""
    x, num_classes = (list(args) + [kwargs.get("num_classes", -1)])[:2]
    if x.dtype is not torch.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if num_classes == -1:
        if not x.numel():
            raise RuntimeError("Can not infer total number of classes from empty tensor.")
        num_classes = int(x.max().item()) + 1
    out = aten.eq.Tensor(x.unsqueeze(-1), aten.arange.default(num_classes, device=x.device)).long()
    checks = value_checks.plan(func, (x, num_classes), {}, Template((Slot(0), num_classes), ()), [x])
    if checks is not None:
        ctx = context(out.device.index or 0)
        with ctx.graph.lock:
            pending = out._lt_storage.value
            node = pending.node if type(pending) is Output else None
            checks.record(ctx, node, [read(x)], location(), (out._lt_storage,))
        ctx.flush_if_due()
    return out
