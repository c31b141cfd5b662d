"""From torch's dispatcher to the IR: every op on a ``tpu`` tensor lands here.

Note [Resolution order]: an op resolves by the first of these that applies:

1. a dispatch-level handler (device moves, ``copy_``, ``item``);
2. a view op: the output shares the input's storage (``frontend.windows``);
3. a lowering rule: the op is recorded (meta kernel for avals and errors);
4. an in-place or ``out=`` form of an op that resolves: run the functional
   op, then write the result into the target (``writes``);
5. ``_foreach_*``: one node (Note [Foreach nodes]), else one call per list element;
6. torch's decomposition table, then CompositeImplicit decomposition, then
   a ``torch.library.custom_op``'s Python body;
7. CPU fallback (counted, warned once per op), or NotImplementedError when
   ``LAZYTPU_CPU_FALLBACK=0``.
"""

from __future__ import annotations

import functools
import threading
import warnings

import torch
from torch._decomp import decomposition_table

from lazytpu import _caches, debug
from lazytpu.engine import RNG_AVAL, STEPS_DUE, context, run_due_steps
from lazytpu.frontend import hostio, metas
from lazytpu.frontend.checks import scalars, value_checks
from lazytpu.frontend.checks.kernel_checks import _check_kernel_dtypes
from lazytpu.frontend.checks.scalars import is_tpu_device
from lazytpu.frontend.routes.fallback import DATA_DEPENDENT, _map_tensors, cpu_fallback
from lazytpu.frontend.tensor import LazyTensor, describe, set_dispatcher
from lazytpu.frontend.windows import contiguous_strides, new_tensor_of, read
from lazytpu.ir import Failed, Node, Output, Scalar, Storage
from lazytpu.ir.node import op_sig
from lazytpu.ir.template import Slot, Template, fill, flatten
from lazytpu.lowering import get_rule

aten = torch.ops.aten

# -- handlers ------------------------------------------------------------------

_HANDLERS: dict = {}

# torch's decompositions to ATen (not the _refs ones, which produce prims).
_DECOMPOSITIONS = {op: fn for op, fn in decomposition_table.items() if not fn.__module__.startswith("torch._refs")}


def handles(*ops):
    """Register a dispatch-level handler (Note [Resolution order], step 1)."""

    def register(fn):
        for op in ops:
            if op in _HANDLERS:
                raise ValueError(f"duplicate dispatch handler for {op}")
            _HANDLERS[op] = fn
        return fn

    return register


# -- meta inference ------------------------------------------------------------

_META_MEMO = _caches.memo("meta_memo")


def _describe(v):
    if type(v) is Scalar:
        return v.kind
    if type(v) is LazyTensor:
        return v._lt_desc
    return ("cpu", v.shape, v.stride(), v.dtype)


class MetaUnavailable(Exception):
    """torch has no meta kernel for this call (often: its output shape
    depends on data); the op must run where data is (CPU fallback)."""


def infer_meta(func, template, values):
    """Output metas of ``func`` (memoized), or torch's own error.

    Note [Meta errors]: meta kernels sometimes word errors differently from
    the CPU kernels (they come from torch._refs). On a meta failure the op is
    re-run on CPU zeros of the same shapes, so that the error
    raised is the one CPU torch users see. If the CPU run succeeds where meta
    had no kernel (or a stricter one), ``MetaUnavailable`` is raised: the CPU
    run's shapes are not trusted, since they may depend on the (stand-in) data.
    """
    key = (func, template, tuple(_describe(v) for v in values))
    hit = _META_MEMO.get(key)
    if hit is not None:
        return hit
    try:
        out = _run_on(func, template, values, "meta")
    except Exception as meta_exc:
        missing = metas.SHAPES.get(func)  # Note [Missing meta kernels]
        if missing is not None:
            out = _META_MEMO[key] = _run_on(missing, template, values, "meta")
            return out
        try:
            _run_on(func, template, values, "cpu")
        except Exception as cpu_exc:
            raise cpu_exc.with_traceback(None) from None
        # CPU accepts the call where meta does not: CPU semantics win, and the
        # op runs where the data is.
        raise MetaUnavailable(f"{type(meta_exc).__name__}: {meta_exc}") from None
    _META_MEMO[key] = out
    return out


def _run_on(func, template, values, device: str):
    def convert(v):
        if type(v) is Scalar:
            return v.value
        if type(v) is LazyTensor:  # same window on a storage of the same size
            storage = new(v._lt_desc.storage_numel, dtype=v.dtype, device=device)
            return storage.as_strided(v.shape, v.stride(), v.storage_offset())
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device).zero_()

    # zeros on CPU: an error must not depend on what uninitialized memory holds
    # (a mask's count, a class index out of range)
    new = torch.zeros if device == "cpu" else torch.empty

    args, kwargs = fill(template, [convert(v) for v in values])
    if is_tpu_device(kwargs.get("device")):
        kwargs["device"] = device
    with torch.no_grad():
        return func(*args, **kwargs)


# -- recording -----------------------------------------------------------------

_NO_LIFT = frozenset({"arange", "linspace", "logspace", "range", "full", "scalar_tensor"})


# A Python float or int passed where the schema takes a Scalar, float or
# Tensor (a wrapped number) is lifted (Note [Scalar lifting]).
_LIFT_TYPES = frozenset({"number", "float", "Optional[number]", "Optional[float]", "Tensor", "Optional[Tensor]"})


# Scalars that select an algorithm rather than enter arithmetic stay static;
# an int also where it picks an exact form (``x ** 2``, ``norm(p=2)``).
_STATIC_NAMES = frozenset({"ord"})
_STATIC_INT_NAMES = _STATIC_NAMES | {"exponent", "p"}

# Python ints an int64 holds; torch makes a larger one a uint64 scalar, which stays static.
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


@functools.cache
def _liftable(func) -> tuple[frozenset, frozenset, frozenset, frozenset]:
    """Positions and kwarg names of the float args, then of the int args,
    that cannot decide shapes."""
    if func._schema.name.split("::")[-1] in _NO_LIFT:
        return frozenset(), frozenset(), frozenset(), frozenset()
    pos, names, int_pos, int_names = set(), set(), set(), set()
    for i, arg in enumerate(func._schema.arguments):
        if str(arg.type) not in _LIFT_TYPES or arg.name.startswith("scale"):
            continue
        key = arg.name if arg.kwarg_only else i
        if arg.name not in _STATIC_NAMES:
            (names if arg.kwarg_only else pos).add(key)
        if arg.name not in _STATIC_INT_NAMES:
            (int_names if arg.kwarg_only else int_pos).add(key)
    return frozenset(pos), frozenset(names), frozenset(int_pos), frozenset(int_names)


def _lifted(a, key, floats: frozenset, ints: frozenset) -> bool:
    t = type(a)
    if t is float or t is complex:
        return key in floats
    return t is int and key in ints and _INT64_MIN <= a <= _INT64_MAX


def _lift(func, args, kwargs):
    pos, names, int_pos, int_names = _liftable(func)
    if pos or int_pos:
        args = tuple(Scalar(a) if _lifted(a, i, pos, int_pos) else a for i, a in enumerate(args))
    if names or int_names:
        kwargs = {k: Scalar(v) if _lifted(v, k, names, int_names) else v for k, v in kwargs.items()}
    return args, kwargs


def _pick(leaf):
    if isinstance(leaf, torch.Tensor):
        if type(leaf) is not LazyTensor and leaf.dim() != 0:
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"tpu:0 and {leaf.device}!"
            )
        return leaf
    if type(leaf) is Scalar:
        return leaf
    return None


def _input_value(v, index: int):
    if type(v) is LazyTensor:
        return read(v)
    if type(v) is Scalar:
        return v
    return hostio.data_from_cpu(v, index)


def _device_index(values) -> int:
    index = None
    for v in values:
        if type(v) is LazyTensor:
            if index is None:
                index = v._lt_index
            elif v._lt_index != index:
                raise RuntimeError(
                    "Expected all tensors to be on the same device, but found at least two devices, "
                    f"tpu:{index} and tpu:{v._lt_index}!"
                )
    return 0 if index is None else index


def _kwarg_device_index(kwargs) -> int | None:
    d = kwargs.get("device")
    if d is None:
        return None
    return torch.device(d).index or 0


def _value_stride(func, m) -> tuple:
    """An output's strides: the meta's, except for a dtype-changing view
    computed as a value (``run_view``) whose meta strides do not cover a dense
    block (``view_as_real`` of a diagonal): that value is stored contiguously."""
    if torch._prims_common.is_non_overlapping_and_dense_or_false(m) or _view_kind(func) != "view":
        return m.stride()
    return contiguous_strides(m.shape)


class _Plan:
    """What recording one call signature needs, computed once (Note [Plans]).

    Note [Plans]: a call's signature is the op, the interned descriptions of
    its tensor arguments, the kinds of its lifted scalars and its static
    arguments. The first call of a signature runs torch's meta kernel and
    builds the plan; every later call is one dict lookup, then a node.
    """

    __slots__ = (
        "template",
        "descs",
        "out_avals",
        "static",
        "random",
        "layout",
        "container",
        "device_index",
        "scalar_check",
        "value_plan",
    )

    def __init__(self, func, template, meta_out, rule, device_index) -> None:
        metas = [meta_out] if isinstance(meta_out, torch.Tensor) else list(meta_out)
        tensors = [m for m in metas if isinstance(m, torch.Tensor)]
        self.descs = tuple(describe(m.shape, _value_stride(func, m), 0, m.numel(), m.dtype) for m in tensors)
        out_avals = tuple(d.aval for d in self.descs)
        self.random = rule.random
        if rule.random:  # the PRNG key is the last input and output (Note [Random state])
            n_slots = _count_slots(template)
            template = Template(template.args + (Slot(n_slots),), template.kwargs)
            out_avals = out_avals + (RNG_AVAL,)
        self.template = template
        self.out_avals = out_avals
        self.static = op_sig(func, template, out_avals)
        self.device_index = device_index
        self.scalar_check = None  # Note [Python integers wrap]: see scalars.per_call_check
        self.value_plan = None  # Note [Value checks]
        if isinstance(meta_out, torch.Tensor):
            self.layout, self.container = None, None
        else:
            it = iter(range(len(tensors)))
            self.layout = tuple(next(it) if isinstance(m, torch.Tensor) else ("const", m) for m in metas)
            self.container = tuple if isinstance(meta_out, tuple) else list

    def pack(self, outs):
        if self.layout is None:
            return outs[0]
        return self.container(outs[e] if type(e) is int else e[1] for e in self.layout)


def _count_slots(leaf) -> int:
    if type(leaf) is Slot:
        return 1
    if type(leaf) is Template:
        return sum(_count_slots(a) for a in leaf.args) + sum(_count_slots(v) for _, v in leaf.kwargs)
    if type(leaf) is tuple:
        return sum(_count_slots(x) for x in leaf)
    return 0


_PLANS = _caches.memo("record_plans")
# ops known to resolve straight to a recorded rule (not handlers, not views)
_RECORDED: dict = {}
_caches.register("recorded_ops", _RECORDED.clear)


def _key_leaf(a, values: list):
    t = type(a)
    if t is LazyTensor:
        values.append(a)
        return a._lt_desc
    if t is list or t is tuple:
        return tuple(_key_leaf(x, values) for x in a)
    if isinstance(a, torch.Tensor):
        _pick(a)  # torch's error for a non-scalar tensor of another device
        values.append(a)
        return ("cpu", a.dtype, a.dim())
    return a


def _signature(func, args, kwargs) -> tuple[tuple, list]:
    """The call's plan key and its values (tensors and lifted scalars), in
    the order ``flatten`` puts them in."""
    pos, names, int_pos, int_names = _liftable(func)
    values: list = []
    parts: list = [func]
    for i, a in enumerate(args):
        t = type(a)
        if t is LazyTensor:
            values.append(a)
            parts.append(a._lt_desc)
        elif ((t is float or t is complex) and i in pos) or (
            t is int and i in int_pos and _INT64_MIN <= a <= _INT64_MAX
        ):
            values.append(Scalar(a))
            parts.append(t)
        else:
            parts.append(_key_leaf(a, values))
    if kwargs:
        for k in sorted(kwargs):
            a = kwargs[k]
            if _lifted(a, k, names, int_names):
                values.append(Scalar(a))
                parts.append((k, type(a)))
            else:
                parts.append((k, _key_leaf(a, values)))
    return tuple(parts), values


def record(func, args, kwargs, rule, into: LazyTensor | None = None, *, flush: bool = True):
    """Record ``func`` as one node; return LazyTensors of its pending outputs.

    With ``into`` (the target of an in-place op, a tensor owning its storage
    with exactly the layout of ``func``'s single output), the storage of
    ``into`` is re-bound to the output instead, and ``into`` is returned.
    ``flush=False``: strict mode does not run the node now (Note [Uninitialized
    factories] in device/registration).
    """
    key, values = _signature(func, args, kwargs)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _make_plan(func, args, kwargs, rule, values)
        _PLANS[key] = plan
    if plan.scalar_check is not None:
        plan.scalar_check(values)
    index = plan.device_index
    if index is None:
        index = _device_index(values)
    ctx = context(index)
    # above this frame: dispatch, LazyTensor.__torch_dispatch__, then the caller (Note [Source locations])
    with ctx.lock:
        lane = ctx.lane()  # Note [Lanes]
        first = True
        for v in values:
            if type(v) is LazyTensor:
                if v._lt_storage.graph is not lane.graph:
                    lane = ctx.lane_for(v._lt_storage, lane, first)
                first = False
        inputs = [
            (v._lt_storage.value if v._lt_window is None else read(v))
            if type(v) is LazyTensor
            else _input_value(v, index)
            for v in values
        ]
        if plan.random:
            inputs.append(ctx.rng_value())
        node = Node(func, plan.template, tuple(inputs), plan.out_avals, debug.location(3), plan.static)
        if plan.value_plan is not None:
            plan.value_plan.record(ctx, node, inputs)
        if plan.random:
            ctx.graph.rng = Output(node, len(plan.out_avals) - 1)
        if into is not None and plan.layout is None and plan.descs[0] is into._lt_desc:
            into._lt_storage.bind(Output(node, 0), lane.graph)  # an in-place op: no tensor in between
            ctx.recorded(node)
            return into
        graph = lane.graph  # new_tensor_of, inlined: this is the per-op path
        outs = [LazyTensor(Storage(Output(node, i), graph, d.stride), d, index, True) for i, d in enumerate(plan.descs)]
        ctx.recorded(node, flush)
    return plan.pack(outs)


def _make_plan(func, args, kwargs, rule, values) -> _Plan:
    args, kwargs = _lift(func, args, kwargs)
    template, flat_values = flatten(args, kwargs, _pick)
    if rule.random:
        _check_generator(kwargs)
    meta_out = infer_meta(func, template, flat_values)
    _check_kernel_dtypes(func, template, flat_values)
    if rule.random:
        plan = _Plan(func, template, meta_out, rule, _kwarg_device_index(kwargs))
        plan.scalar_check = scalars.random_check(func, template)
    else:
        scalars.check_at_plan(func, args, kwargs, template, flat_values, meta_out)
        plan = _Plan(func, template, meta_out, rule, _kwarg_device_index(kwargs))
        plan.scalar_check = scalars.per_call_check(func, kwargs, template, flat_values, meta_out)
    plan.value_plan = value_checks.plan(func, args, kwargs, template, flat_values)
    return plan


def _check_generator(kwargs) -> None:
    """torch's ``check_generator``: a random op given a generator of another
    device raises (there are no tpu generators: torch has no Python hook to
    make one). Ignoring it would also put the generator in the program key."""
    generator = kwargs.get("generator")
    if generator is not None:
        raise RuntimeError(f"Expected a 'tpu' device type for generator but found '{generator.device.type}'")


# -- foreach -------------------------------------------------------------------

# -- the dispatcher ------------------------------------------------------------


_COPY = aten.copy_.default


def _ends_step_wait(func, args) -> bool:
    """Whether ``func`` dispatches the program of a step that ended (Note [Step
    boundary] in engine): any op but a copy from the host (the next batch) and
    a view (``loss.detach()``), which compute nothing."""
    if func is _COPY:
        return type(args[1]) is LazyTensor
    return _view_kind(func) != "view"


def dispatch(func, args, kwargs):
    """Resolve one op (Note [Resolution order])."""
    if STEPS_DUE and _ends_step_wait(func, args):
        run_due_steps()
    if func in INDEX_OPS and len(args) > 1 and type(args[0]) is LazyTensor:
        args, out = prepare_indexing(func, args, kwargs)  # Note [Advanced indexing]
        if out is not None:
            return out
    rule = _RECORDED.get(func)
    if rule is not None:  # the common case first: one dict lookup
        try:
            return record(func, args, kwargs, rule)
        except MetaUnavailable:
            return cpu_fallback(func, args, kwargs, data_dependent=func in DATA_DEPENDENT)
    functional = _INPLACE.get(func)
    if functional is not None:  # then in-place ops of recorded ones
        return _run_inplace(func, functional, args, kwargs)
    handler = _HANDLERS.get(func)
    if handler is not None:
        return handler(func, args, kwargs)
    kind = _view_kind(func)
    if kind == "view" and type(args[0]) is LazyTensor:
        out = run_view(func, args, kwargs)
        if out is not None:
            return out
    elif kind == "inplace_view":
        return run_inplace_view(func, args, kwargs)
    rule = get_rule(func)
    if rule is not None:
        if not kind and func not in _HANDLERS:
            _RECORDED[func] = rule
        try:
            return record(func, args, kwargs, rule)
        except MetaUnavailable:
            return cpu_fallback(func, args, kwargs, data_dependent=func in DATA_DEPENDENT)
    name = func._schema.name
    if name.startswith("aten::_foreach_"):
        out = foreach.run_foreach(func, args, kwargs)
        if out is not NotImplemented:
            return out
    if _is_inplace(func):
        functional = _functional_of(func)
        if functional is not None and _resolves(functional):
            if not kind and func not in _HANDLERS and not name.startswith("aten::_foreach_"):
                _INPLACE[func] = functional
            return _run_inplace(func, functional, args, kwargs)
    elif _out_args(func):
        functional = _functional_of(func)
        if functional is not None and _resolves(functional):
            return _run_out(func, functional, args, kwargs)
    if func not in _DECOMPOSING.ops:
        decomp = _DECOMPOSITIONS.get(func)
        _DECOMPOSING.ops.add(func)
        try:
            if decomp is not None:
                _check_with_meta(func, args, kwargs)
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
def _resolves(func) -> bool:
    """Whether ``func`` runs on device (rule or decomposition)."""
    return get_rule(func) is not None or func in _DECOMPOSITIONS or func._can_decompose()


_DECOMPOSED_CHECKED = _caches.memo("decomposed_checked")


def _check_with_meta(func, args, kwargs) -> None:
    """torch's errors for a call about to be decomposed: the meta kernel's,
    and the CPU kernel's (Note [Kernel checks]); once per call signature."""
    args, kwargs = _lift(func, args, kwargs)
    template, values = flatten(args, kwargs, _pick)
    key = (func, template, tuple(_describe(v) for v in values))
    if key in _DECOMPOSED_CHECKED:
        return
    try:
        infer_meta(func, template, values)
    except MetaUnavailable:
        pass
    _check_kernel_dtypes(func, template, values)
    _DECOMPOSED_CHECKED.add(key)


def failed_outputs(func, args, kwargs, error: Exception):
    """Outputs of ``func`` whose values are ``error`` (Note [Errors in
    backward]); shapes from the meta kernel, else from CPU on empty inputs."""
    args_l, kwargs_l = _lift(func, args, kwargs)
    template, values = flatten(args_l, kwargs_l, _pick)
    wrapped = RuntimeError(f"lazytpu: {func} failed inside backward: {type(error).__name__}: {error}")
    try:
        out = _run_on(func, template, values, "meta")
    except Exception:  # noqa: BLE001 - fall through to the CPU shapes
        try:
            out = _run_on(func, template, values, "cpu")
        except Exception:  # noqa: BLE001 - nothing better to offer
            raise error from None
    index = _device_index(values)
    warnings.warn(str(wrapped), RuntimeWarning, stacklevel=2)

    def make(m):
        desc = describe(m.shape, m.stride(), 0, m.numel(), m.dtype)
        return new_tensor_of(Failed(wrapped, desc.aval), desc, index)

    return _map_tensors(out, torch.Tensor, make)


set_dispatcher(dispatch, failed_outputs)

# These modules import the recording functions above, so they come last.
from lazytpu.frontend.routes import foreach, handlers  # noqa: E402,F401  (handlers registers the dispatch-level handlers)
from lazytpu.frontend.routes.advanced_indexing import INDEX_OPS, prepare_indexing  # noqa: E402
from lazytpu.frontend.routes.foreach import run_foreach  # noqa: E402,F401  (also the compile backend's decomposition)
from lazytpu.frontend.routes.inplace import _INPLACE, _functional_of, _is_inplace, _out_args, _run_inplace, _run_out  # noqa: E402
from lazytpu.frontend.routes.views import _view_kind, run_inplace_view, run_view  # noqa: E402
