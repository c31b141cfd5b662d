"""From torch's dispatcher to the IR: every op on a ``tpu`` tensor lands here.

Note [Resolution order]: the route of an op, tried in this order:

1. a dispatch-level handler (device moves, ``copy_``, ``item``; ``record.handles``);
2. a view op: the output shares the input's storage (``frontend.windows``);
3. a lowering rule: the op is recorded (meta kernel for avals and errors);
4. ``_foreach_*``: one node (Note [Foreach nodes]), else one call per list element;
5. an in-place or ``out=`` form of an op that resolves: run the functional
   op, then write the result into the target (``routes.inplace``);
6. torch's decomposition table, then CompositeImplicit decomposition, then
   a Python kernel of a ``torch.library`` op for the device: a ``custom_op``'s
   kernel for ``tpu``, else its body for every device; a kernel registered
   for ``PrivateUse1`` (as FSDP2's ``fsdp.*`` ops have) or for every device
   (``CompositeExplicitAutograd``). Torch never calls these for a tensor
   subclass. A ``custom_op`` whose kernels are all for other devices
   (``device_types="cpu"``, a NumPy body) runs its CPU kernel (step 7);
7. CPU fallback (counted, warned once per op), or NotImplementedError when
   ``LAZYTPU_CPU_FALLBACK=0``.

Note [Composite ops below autograd]: an op with a CompositeImplicitAutograd
kernel (``reshape``, ``to``, ``contiguous``, ``flatten``) is decomposed by
torch above autograd and never reaches a backend, except below autograd:
under ``torch.inference_mode()``, and where torch calls it from a kernel
that already passed autograd. There it arrives whole, and its schema may
say "view" where its kernel copies (``reshape`` of a transposed tensor,
``to`` of another dtype). Such an op skips step 2 and is decomposed as its
kernel says (step 6), so it views or copies as on CPU.

The route of an op is chosen once, from the op alone (``route``: a ``Route``
in ``record.ROUTES``); a step that can decline a particular call (a view
computed as a value, ``NotImplemented`` from a decomposition) hands it to the
route of the steps after it. Registering a handler forgets the routes of its
ops. ``tools/coverage`` reads the routes through ``route``.

This module only resolves: what each route does lives in ``record`` and
``routes/``, which never import it (they re-enter it through
``tensor.redispatch``, Note [Tensor backend]).
"""

from __future__ import annotations

import functools
import threading

import torch

from lazytpu import _caches
from lazytpu.engine import STEPS_DUE, run_due_steps
from lazytpu.frontend import hostio, tensor
from lazytpu.frontend.checks import scalars
from lazytpu.frontend.metas import MetaUnavailable
from lazytpu.frontend.record import (
    DECOMPOSITIONS,
    HANDLERS,
    ROUTES,
    Route,
    check_with_meta,
    record,
)
from lazytpu.frontend.routes import handlers, higher_order, metadata, transformer  # noqa: F401  (register their handlers)
from lazytpu.frontend.routes.advanced_indexing import INDEX_OPS, prepare_indexing
from lazytpu.frontend.routes.fallback import DATA_DEPENDENT, cpu_fallback
from lazytpu.frontend.routes.foreach import run_foreach  # noqa: F401  (also the compile backend's decomposition)
from lazytpu.frontend.routes.inplace import inplace_runner, run_out
from lazytpu.frontend.routes.views import run_inplace_view, run_view
from lazytpu.frontend.schema import functional_of, out_args, view_kind, writes_arguments
from lazytpu.frontend.tensor import LazyTensor
from lazytpu.lowering import get_rule

aten = torch.ops.aten


_COPY = aten.copy_.default


def _ends_step_wait(func, args) -> bool:
    """Whether ``func`` dispatches the program of a step that ended (Note [Step
    boundary] in engine): any op but a copy from the host (the next batch) and
    a view (``loss.detach()``), which compute nothing."""
    if func is _COPY:
        return type(args[1]) is LazyTensor
    return view_kind(func) != "view"


# Note [Default dtype]: torch.get_default_dtype() decides some results'
# dtypes (int / int, sqrt of an int, int + 5.5, factories), and the memos of
# recording (plans, output metas, checks) are keyed by call signatures that
# do not hold it: after torch.set_default_dtype(torch.float64), a cached plan
# made float32 where CPU makes float64. A dispatch that sees another default
# dtype than the last one forgets the memos (one C call per op to check).
_default_dtype = torch.get_default_dtype()


def _default_dtype_changed() -> None:
    global _default_dtype
    _default_dtype = torch.get_default_dtype()
    _caches.clear_memos()


def dispatch(func, args, kwargs):
    """Resolve one op (Note [Resolution order]): its route, chosen once per op."""
    if torch.get_default_dtype() is not _default_dtype:
        _default_dtype_changed()
    if STEPS_DUE and _ends_step_wait(func, args):
        run_due_steps()
    known = ROUTES.get(func)
    if known is None:
        known = route(func)
    return known.run(func, args, kwargs)


def route(func) -> Route:
    """The ``Route`` of ``func`` (memoized in ``record.ROUTES``): the steps of
    Note [Resolution order] that can apply to it, in that order. A step that
    may decline a call (a view computed as a value, a foreach op run element
    by element, a decomposition that returns ``NotImplemented``) falls
    through to the route of the steps after it."""
    chosen = ROUTES.get(func)
    if chosen is None:
        chosen = ROUTES[func] = _route(func)
    return chosen


def _route(func) -> Route:
    handler = HANDLERS.get(func)
    chosen = Route("handler", handler) if handler is not None else _after_handlers(func)
    if func in INDEX_OPS:  # Note [Advanced indexing]: checked and prepared first
        chosen = _indexing(chosen)
    if func in _MADE_LIKE:
        chosen = _elsewhere(chosen)
    if func in handlers.CHECKED_EX:
        chosen = _checking_errors(chosen)
    return chosen


def _checking_errors(rest: Route) -> Route:
    """An ``_ex`` op's route that honours ``check_errors`` (Note [check_errors] in routes.handlers)."""

    def checked(func, args, kwargs):
        return handlers.check_errors_after(func, rest.run, args, kwargs)

    return Route(rest.kind, checked, rest.rule, rest.functional)


# Note [Made elsewhere]: ``torch.zeros_like(t, device="cpu")`` and
# ``t.new_empty(n, device="meta")`` take only sizes, dtype and layout from a
# tpu tensor and make their result on another device. Such a call runs there
# on a stand-in with ``t``'s layout and no data (made on tpu, it was a tpu
# tensor, silently).
_aten = torch.ops.aten
_MADE_LIKE = frozenset(
    {
        *(getattr(_aten, n).default for n in ("empty_like", "zeros_like", "ones_like", "full_like")),
        *(getattr(_aten, n).default for n in ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_zeros")),
        *(getattr(_aten, n).default for n in ("rand_like", "randn_like")),
        _aten.rand_like.generator,
        _aten.randn_like.generator,
        *(getattr(_aten.randint_like, o) for o in _aten.randint_like.overloads()),
    }
)


def _elsewhere(rest: Route) -> Route:
    def made_elsewhere(func, args, kwargs):
        device = kwargs.get("device")
        if device is None or torch.device(device).type == "tpu":
            return rest.run(func, args, kwargs)
        src = args[0]
        stand_in = torch.empty_strided(src.shape, src.stride(), dtype=src.dtype, device=device)
        return func(stand_in, *args[1:], **kwargs)

    return Route(rest.kind, made_elsewhere, rest.rule, rest.functional)


def _after_handlers(func) -> Route:
    kind = view_kind(func)
    if kind == "inplace_view":
        return Route("inplace_view", run_inplace_view)
    rest = _after_views(func)
    if kind != "view" or func._can_decompose():  # Note [Composite ops below autograd]
        return rest

    def view(func, args, kwargs):
        if type(args[0]) is LazyTensor:
            out = run_view(func, args, kwargs)
            if out is not None:
                return out
        return rest.run(func, args, kwargs)

    return Route("view", view, rest.rule, rest.functional)


def _after_views(func) -> Route:
    rule = get_rule(func)
    if rule is not None:

        def recorded(func, args, kwargs):
            try:
                return record(func, args, kwargs, rule)
            except MetaUnavailable:
                return cpu_fallback(func, args, kwargs, data_dependent=func in DATA_DEPENDENT)

        return Route("recorded", recorded, rule)
    rest = _after_foreach(func)
    if not func._schema.name.startswith("aten::_foreach_"):
        return rest

    def foreach(func, args, kwargs):
        out = run_foreach(func, args, kwargs)
        return rest.run(func, args, kwargs) if out is NotImplemented else out

    return Route("foreach", foreach, None, rest.functional)


def _after_foreach(func) -> Route:
    if writes_arguments(func) or out_args(func):
        functional = functional_of(func)
        if functional is not None and resolves(functional):
            if writes_arguments(func):
                return Route("inplace", inplace_runner(func, functional, route), None, functional)
            return Route("out", lambda f, a, k: run_out(f, functional, a, k), None, functional)
    last = _last(func)
    decomp = DECOMPOSITIONS.get(func)
    checked = scalars.value_checked(func)

    def decomposed(func, args, kwargs):
        if func in _DECOMPOSING.ops:  # a decomposition calling its own op again
            return last.run(func, args, kwargs)
        if checked:
            scalars.check_decomposed_values(func, args, kwargs)
        _DECOMPOSING.ops.add(func)
        try:
            if decomp is not None:
                check_with_meta(func, args, kwargs)
                return decomp(*args, **kwargs)
            out = func.decompose(*args, **kwargs)
        finally:
            _DECOMPOSING.ops.discard(func)
        return last.run(func, args, kwargs) if out is NotImplemented else out

    if decomp is not None or func._can_decompose():
        return Route("decomposed", decomposed)
    return last


def _last(func) -> Route:
    body = _custom_op_body(func)
    if body is not None:
        return Route("custom", lambda f, a, k: body(*a, **k))
    return Route("fallback", lambda f, a, k: cpu_fallback(f, a, k, data_dependent=f in DATA_DEPENDENT))


def _indexing(rest: Route) -> Route:
    def indexing(func, args, kwargs):
        if len(args) > 1 and type(args[0]) is LazyTensor:
            args, out = prepare_indexing(func, args, kwargs)
            if out is not None:
                return out
        elif len(args) > 1 and args[0].device.type == "cpu" and any(type(i) is LazyTensor for i in args[1]):
            raise RuntimeError("indices should be either on cpu or on the same device as the indexed tensor (cpu)")
        return rest.run(func, args, kwargs)

    return Route(rest.kind, indexing, rest.rule, rest.functional)


class _Decomposing(threading.local):
    """Ops being decomposed on this thread: a decomposition that calls its own
    op again must not recurse forever (it falls back instead)."""

    def __init__(self) -> None:
        self.ops: set = set()


_DECOMPOSING = _Decomposing()


_DEVICE_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


@functools.cache
def _custom_op_body(func):
    """The Python kernel of a ``torch.library`` op for the device (step 6):
    torch ops on tensors, so it runs on ``tpu`` tensors as user code does.
    None where the op has none (its kernels are for other devices)."""
    if func.namespace == "aten":
        return None
    opdef = torch._library.custom_ops._maybe_get_opdef(func)
    if opdef is not None:
        kernels = opdef._backend_fns  # by device type; None: every device
        return kernels.get("tpu", kernels.get(None))
    name = func._opname if func._overloadname == "default" else f"{func._opname}.{func._overloadname}"
    if any(f"{func.namespace}/{name}/{key}" in torch.library._impls for key in _DEVICE_KERNEL_KEYS):
        return functools.partial(func.redispatch, _DEVICE_KEYS)
    return None


_DEVICE_KERNEL_KEYS = ("PrivateUse1", "CompositeExplicitAutograd")


@functools.cache
def resolves(func) -> bool:
    """Whether ``func`` runs on device (rule or decomposition)."""
    return get_rule(func) is not None or func in DECOMPOSITIONS or func._can_decompose()


tensor.install(dispatch=dispatch, to_cpu=hostio.to_cpu, saved_storage=hostio.saved_storage)
