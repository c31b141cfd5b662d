"""From torch's dispatcher to the IR: every op on a ``tpu`` tensor lands here.

Note [Resolution order]: the route of an op, tried in this order:

1. a dispatch-level handler (device moves, ``copy_``, ``item``; ``record.handles``);
2. a view op: the output shares the input's storage (``frontend.windows``);
3. a lowering rule: the op is recorded (meta kernel for avals and errors);
4. an in-place or ``out=`` form of an op that resolves: run the functional
   op, then write the result into the target (``routes.inplace``);
5. ``_foreach_*``: one node (Note [Foreach nodes]), else one call per list element;
6. torch's decomposition table, then CompositeImplicit decomposition, then
   a ``torch.library.custom_op``'s Python body;
7. CPU fallback (counted, warned once per op), or NotImplementedError when
   ``LAZYTPU_CPU_FALLBACK=0``.

This module only resolves: what each route does lives in ``record`` and
``routes/``, which never import it (they re-enter it through
``tensor.redispatch``, Note [Tensor backend]).
"""

from __future__ import annotations

import functools
import threading

import torch

from lazytpu.engine import STEPS_DUE, run_due_steps
from lazytpu.frontend import hostio, tensor
from lazytpu.frontend.metas import MetaUnavailable
from lazytpu.frontend.record import DECOMPOSITIONS, HANDLERS, RECORDED, check_with_meta, failed_outputs, record
from lazytpu.frontend.routes import foreach, handlers  # noqa: F401  (handlers registers the dispatch-level handlers)
from lazytpu.frontend.routes.advanced_indexing import INDEX_OPS, prepare_indexing
from lazytpu.frontend.routes.fallback import DATA_DEPENDENT, cpu_fallback
from lazytpu.frontend.routes.foreach import run_foreach  # noqa: F401  (also the compile backend's decomposition)
from lazytpu.frontend.routes.inplace import INPLACE_OPS, run_inplace, run_out
from lazytpu.frontend.routes.views import run_inplace_view, run_view
from lazytpu.frontend.schema import functional_of, is_inplace, out_args, view_kind
from lazytpu.frontend.tensor import LazyTensor
from lazytpu.lowering import get_rule

aten = torch.ops.aten


_COPY = aten.copy_.default
_handler_of = HANDLERS.get  # the handlers' dict lookup, bound once: it runs per op


def _ends_step_wait(func, args) -> bool:
    """Whether ``func`` dispatches the program of a step that ended (Note [Step
    boundary] in engine): any op but a copy from the host (the next batch) and
    a view (``loss.detach()``), which compute nothing."""
    if func is _COPY:
        return type(args[1]) is LazyTensor
    return view_kind(func) != "view"


def dispatch(func, args, kwargs):
    """Resolve one op (Note [Resolution order])."""
    if STEPS_DUE and _ends_step_wait(func, args):
        run_due_steps()
    if func in INDEX_OPS and len(args) > 1 and type(args[0]) is LazyTensor:
        args, out = prepare_indexing(func, args, kwargs)  # Note [Advanced indexing]
        if out is not None:
            return out
    rule = RECORDED.get(func)
    if rule is not None:  # the common case first: one dict lookup
        try:
            return record(func, args, kwargs, rule)
        except MetaUnavailable:
            return cpu_fallback(func, args, kwargs, data_dependent=func in DATA_DEPENDENT)
    functional = INPLACE_OPS.get(func)
    if functional is not None:  # then in-place ops of recorded ones
        return run_inplace(func, functional, args, kwargs)
    handler = _handler_of(func)
    if handler is not None:
        return handler(func, args, kwargs)
    kind = view_kind(func)
    if kind == "view" and type(args[0]) is LazyTensor:
        out = run_view(func, args, kwargs)
        if out is not None:
            return out
    elif kind == "inplace_view":
        return run_inplace_view(func, args, kwargs)
    rule = get_rule(func)
    if rule is not None:
        if not kind and func not in HANDLERS:
            RECORDED[func] = rule
        try:
            return record(func, args, kwargs, rule)
        except MetaUnavailable:
            return cpu_fallback(func, args, kwargs, data_dependent=func in DATA_DEPENDENT)
    name = func._schema.name
    if name.startswith("aten::_foreach_"):
        out = run_foreach(func, args, kwargs)
        if out is not NotImplemented:
            return out
    if is_inplace(func):
        functional = functional_of(func)
        if functional is not None and resolves(functional):
            if not kind and func not in HANDLERS and not name.startswith("aten::_foreach_"):
                INPLACE_OPS[func] = functional
            return run_inplace(func, functional, args, kwargs)
    elif out_args(func):
        functional = functional_of(func)
        if functional is not None and resolves(functional):
            return run_out(func, functional, args, kwargs)
    if func not in _DECOMPOSING.ops:
        decomp = DECOMPOSITIONS.get(func)
        _DECOMPOSING.ops.add(func)
        try:
            if decomp is not None:
                check_with_meta(func, args, kwargs)
                return decomp(*args, **kwargs)
            out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        finally:
            _DECOMPOSING.ops.discard(func)
    body = _custom_op_body(func)
    if body is not None:
        return body(*args, **kwargs)
    return cpu_fallback(func, args, kwargs, data_dependent=func in DATA_DEPENDENT)


class _Decomposing(threading.local):
    """Ops being decomposed on this thread: a decomposition that calls its own
    op again must not recurse forever (it falls back instead)."""

    def __init__(self) -> None:
        self.ops: set = set()


_DECOMPOSING = _Decomposing()


@functools.cache
def _custom_op_body(func):
    """A ``torch.library.custom_op``'s Python body (step 6): torch ops on
    tensors, so it runs on ``tpu`` tensors as user code does."""
    if func.namespace == "aten":
        return None
    opdef = torch._library.custom_ops._maybe_get_opdef(func)
    return None if opdef is None else opdef._init_fn


@functools.cache
def resolves(func) -> bool:
    """Whether ``func`` runs on device (rule or decomposition)."""
    return get_rule(func) is not None or func in DECOMPOSITIONS or func._can_decompose()


tensor.install(
    dispatch=dispatch, on_backward_error=failed_outputs, to_cpu=hostio.to_cpu, saved_storage=hostio.saved_storage
)
