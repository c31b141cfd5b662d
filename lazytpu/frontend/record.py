"""Recording one op: its call signature, its plan (made once per signature), its node.

Note [Plans] says what a plan holds; Note [Scalar lifting] which Python
numbers become program inputs. The routes (``frontend/routes``) and the
resolver (``frontend/dispatch``) call ``record`` with the lowering rule of
the op they record; ``handles`` registers the dispatch-level handlers of
Note [Resolution order], step 1.
"""

from __future__ import annotations

import functools

import torch
from torch._decomp import decomposition_table

from lazytpu import _caches, _dtypes, runtime
from lazytpu._registry import Registry
from lazytpu.engine import context
from lazytpu.frontend import hostio, schema
from lazytpu.frontend.checks import scalars, value_checks
from lazytpu.frontend.checks.kernel_checks import check_kernel_dtypes, degrees_of_freedom_check
from lazytpu.frontend.generator import own_generator
from lazytpu.frontend.metas import MetaUnavailable, infer_meta, value_key
from lazytpu.frontend.tensor import LazyTensor, contiguous_strides, describe, tpu_device
from lazytpu.frontend.windows import read
from lazytpu.ir import Node, Output, Scalar, Storage
from lazytpu.ir.node import RNG_AVAL, op_sig
from lazytpu.ir.source import location
from lazytpu.ir.template import Slot, Template, flatten

aten = torch.ops.aten

# -- dispatch-level handlers ----------------------------------------------------

HANDLERS = Registry("dispatch handler")  # op -> handler(func, args, kwargs)

# torch's decompositions to ATen (not the _refs ones, which produce prims).
DECOMPOSITIONS = {op: fn for op, fn in decomposition_table.items() if not fn.__module__.startswith("torch._refs")}


def handles(*ops):
    """Register a dispatch-level handler (Note [Resolution order], step 1);
    routes already chosen for these ops are forgotten."""
    for op in ops:
        ROUTES.pop(op, None)
    return HANDLERS.register(*ops)


class Route:
    """How the resolver runs one op (Note [Resolution order] in frontend/dispatch).

    ``run(func, args, kwargs)`` does it; ``kind`` names the step that chose it
    (``"handler"``, ``"view"``, ``"inplace_view"``, ``"recorded"``, ``"foreach"``,
    ``"inplace"``, ``"out"``, ``"decomposed"``, ``"custom"``, ``"fallback"``),
    ``rule`` is the lowering rule a recorded op records with, and
    ``functional`` the op an in-place or ``out=`` form runs.
    """

    __slots__ = ("kind", "run", "rule", "functional")

    def __init__(self, kind: str, run, rule=None, functional=None) -> None:
        self.kind, self.run, self.rule, self.functional = kind, run, rule, functional

    def __repr__(self) -> str:
        return f"Route({self.kind})"


# op -> its Route, chosen once per op by ``dispatch.route``
ROUTES: dict = _caches.table("routes")


# ``histc``'s min and max select an algorithm too: equal, the range is the data's (Note [Value checks])
_NO_LIFT = frozenset({"arange", "linspace", "logspace", "range", "full", "scalar_tensor", "histc"})


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


def lift(func, args, kwargs):
    pos, names, int_pos, int_names = _liftable(func)
    if pos or int_pos:
        args = tuple(Scalar(a) if _lifted(a, i, pos, int_pos) else a for i, a in enumerate(args))
    if names or int_names:
        kwargs = {k: Scalar(v) if _lifted(v, k, names, int_names) else v for k, v in kwargs.items()}
    return args, kwargs


def pick(leaf):
    if isinstance(leaf, torch.Tensor):
        if type(leaf) is not LazyTensor:
            if leaf.device.type == "tpu":  # a FakeTensor met a real tpu tensor: no device mix to name
                raise RuntimeError(
                    f"lazytpu: a real tpu tensor met a {type(leaf).__name__} on {leaf.device}, which only a "
                    "tracing mode can compute with; under a FakeTensorMode make every tensor inside the mode "
                    "or convert it with the mode's from_tensor"
                )
            if leaf.dim() != 0:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"tpu:0 and {leaf.device}!"
                )
        return leaf
    if type(leaf) is Scalar:
        return leaf
    return None


def input_value(v, index: int):
    """A node's input for the call value ``v``: a tpu tensor's value read through
    its window, a lifted scalar, or a CPU tensor (a scalar one) copied to the device."""
    if type(v) is LazyTensor:
        return read(v)
    if type(v) is Scalar:
        return v
    return hostio.data_from_cpu(v, index)


def device_index(values) -> int:
    index = None
    for v in values:
        if type(v) is LazyTensor:
            i = v._lt_storage.graph.index
            if index is None:
                index = i
            elif i != index:
                raise RuntimeError(
                    "Expected all tensors to be on the same device, but found at least two devices, "
                    f"tpu:{index} and tpu:{i}!"
                )
    return 0 if index is None else index


def kwarg_device_index(kwargs) -> int | None:
    d = kwargs.get("device")
    if d is None:
        return None
    return runtime.platform.index_or_current(torch.device(d).index)


def _value_stride(func, m) -> tuple:
    """An output's strides: the meta's, except for a dtype-changing view
    computed as a value (``run_view``) whose meta strides do not cover a dense
    block (``view_as_real`` of a diagonal): that value is stored contiguously."""
    if torch._prims_common.is_non_overlapping_and_dense_or_false(m) or schema.view_kind(func) != "view":
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
        tensors = [t for m in metas for t in (m if _tensor_list(m) else (m,)) if isinstance(t, torch.Tensor)]
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
            self.layout = tuple(
                next(it) if isinstance(m, torch.Tensor) else [next(it) for _ in m] if _tensor_list(m) else ("const", m)
                for m in metas
            )
            self.container = tuple if isinstance(meta_out, tuple) else list

    def pack(self, outs):
        if self.layout is None:
            return outs[0]
        return self.container(
            outs[e] if type(e) is int else [outs[i] for i in e] if type(e) is list else e[1] for e in self.layout
        )


def _tensor_list(m) -> bool:
    """A ``Tensor[]`` among an op's outputs (``(Tensor[] self_out, Tensor found_inf_out)``)."""
    return type(m) is list and all(isinstance(t, torch.Tensor) for t in m)


def _count_slots(leaf) -> int:
    if type(leaf) is Slot:
        return 1
    if type(leaf) is Template:
        return sum(_count_slots(a) for a in leaf.args) + sum(_count_slots(v) for _, v in leaf.kwargs)
    if type(leaf) is tuple:
        return sum(_count_slots(x) for x in leaf)
    return 0


PLANS = _caches.memo("record_plans")


def key_leaf(a, values: list):
    t = type(a)
    if t is LazyTensor:
        values.append(a)
        return a._lt_desc
    if t is list or t is tuple:
        return tuple(key_leaf(x, values) for x in a)
    if isinstance(a, torch.Tensor):
        pick(a)  # torch's error for a non-scalar tensor of another device
        values.append(a)
        return ("cpu", a.dtype, a.dim())
    if t is torch.device and a.index is None and a.type == "tpu":  # the current device (Note [Current device])
        return tpu_device(runtime.platform.current_index())
    return a


def plan_key(func, args, kwargs) -> tuple[tuple, list]:
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
            parts.append(key_leaf(a, values))
    if kwargs:
        for k in sorted(kwargs):
            a = kwargs[k]
            if _lifted(a, k, names, int_names):
                values.append(Scalar(a))
                parts.append((k, type(a)))
            else:
                parts.append((k, key_leaf(a, values)))
    return tuple(parts), values


def record(func, args, kwargs, rule, into: LazyTensor | None = None, *, flush: bool = True):
    """Record ``func`` as one node; return LazyTensors of its pending outputs.

    With ``into`` (the target of an in-place op), when ``into`` owns its
    storage with exactly the layout of ``func``'s single output, the storage
    of ``into`` is re-bound to the output instead, and ``into`` is returned;
    otherwise the caller writes the outputs into it.
    ``flush=False``: strict mode does not run the node now (Note [Uninitialized
    factories] in device/registration).
    """
    generator = None
    if rule.random:  # Note [tpu generators]
        args, kwargs, generator = own_generator(args, kwargs)
    key, values = plan_key(func, args, kwargs)
    plan = PLANS.get(key)
    if plan is None:
        plan = make_plan(func, args, kwargs, rule, values)
        PLANS[key] = plan
    if plan.scalar_check is not None:
        plan.scalar_check(values)
    index = plan.device_index
    if index is None:
        index = device_index(values)
    ctx = context(index)
    # above this frame: dispatch, LazyTensor.__torch_dispatch__, then the caller
    # (Note [Source locations] in lazytpu.ir.source)
    with ctx.lock:
        lane = ctx.lane()  # Note [Lanes]
        first = True
        for v in values:
            if type(v) is LazyTensor:
                if v._lt_storage.graph is not lane.graph:
                    lane = ctx.lane_for(v._lt_storage, lane, first)
                first = False
        ctx.note_task(lane)  # Note [Step segments]: may run the lane, before its values are read
        inputs = [
            (v._lt_storage.value if not v._lt_windowed else read(v)) if type(v) is LazyTensor else input_value(v, index)
            for v in values
        ]
        if plan.random:
            inputs.append(ctx.rng_value() if generator is None else generator.key(ctx, lane))
        node = Node(func, plan.template, tuple(inputs), plan.out_avals, location(3), plan.static)
        first = None  # what an in-place call writes, when not the node's first result
        if plan.value_plan is not None:
            first = plan.value_plan.record(ctx, node, inputs, in_place=into is not None)
        if plan.random:
            if generator is None:
                ctx.graph.rng = Output(node, len(plan.out_avals) - 1)
            else:
                generator.advance(Output(node, len(plan.out_avals) - 1), lane.graph)
        if into is not None and plan.layout is None and plan.descs[0] is into._lt_desc and not into._lt_windowed:
            into._lt_storage.bind(first or Output(node, 0), lane.graph)  # an in-place op: no tensor in between
            ctx.recorded(node, task=False, lane=lane)  # noted above
            return into
        graph = lane.graph  # new_tensor_of, inlined: this is the per-op path
        outs = [LazyTensor(Storage(Output(node, i), graph, d.stride), d, True) for i, d in enumerate(plan.descs)]
        if first is not None:
            outs[0] = LazyTensor(Storage(first, graph, plan.descs[0].stride), plan.descs[0], True)
        ctx.recorded(node, flush, task=False, lane=lane)
    return plan.pack(outs)


# Note [Determinism alerts]: under ``torch.use_deterministic_algorithms(True)``
# the CPU kernels of a few ops raise (or warn, with ``warn_only=True``) on
# every device, at every call: ``put_`` without ``accumulate`` (repeated
# indices write in no defined order). The flag is global state, not part of a
# plan: the alert runs with the plan's per-call check. Each entry takes the
# call and gives the name torch's alert uses, or None.
_NONDETERMINISTIC = {
    aten.put.default: lambda args, kwargs: None if (args[3:] or [kwargs.get("accumulate", False)])[0] else "put_",
}


def _alert_then(caller: str, check, values) -> None:
    torch._prims_common.alert_not_deterministic(caller)
    if check is not None:
        check(values)


def _check_then(first, check, values) -> None:
    first(values)
    if check is not None:
        check(values)


def make_plan(func, args, kwargs, rule, values) -> _Plan:
    args, kwargs = lift(func, args, kwargs)
    template, flat_values = flatten(args, kwargs, pick)
    meta_out = infer_meta(func, template, flat_values)
    check_kernel_dtypes(func, template, flat_values)
    lowered = template
    default = torch.get_default_dtype()
    if default is not torch.float32:  # Note [Default dtype in programs] in lazytpu._dtypes
        lowered = Template(template.args, (*template.kwargs, (_dtypes.DEFAULT_KWARG, default)))
    if rule.random:
        plan = _Plan(func, lowered, meta_out, rule, kwarg_device_index(kwargs))
        plan.scalar_check = scalars.random_check(func, template)
    else:
        scalars.check_at_plan(func, args, kwargs, template, flat_values, meta_out)
        plan = _Plan(func, lowered, meta_out, rule, kwarg_device_index(kwargs))
        plan.scalar_check = scalars.per_call_check(func, kwargs, template, flat_values, meta_out)
        caller = _NONDETERMINISTIC.get(func, lambda a, k: None)(args, kwargs)
        if caller is not None:
            plan.scalar_check = functools.partial(_alert_then, caller, plan.scalar_check)
        warn = degrees_of_freedom_check(func, template, flat_values, meta_out)
        if warn is not None:
            plan.scalar_check = functools.partial(_check_then, warn, plan.scalar_check)
    check_dims(func, flat_values, plan.descs)
    plan.value_plan = value_checks.plan(func, args, kwargs, template, flat_values, next(iter(plan.out_avals), None))
    return plan


def check_dims(func, values: list, descs: tuple) -> None:
    """A clear error for a value (an input, or an output described by ``descs``) of
    more than ``hostio.MAX_DIMS`` dims, which CPU torch computes (elementwise ops)
    and a device program cannot hold."""
    shapes = [d.shape for d in descs] + [v.shape for v in values if isinstance(v, torch.Tensor)]
    dims = max(map(len, shapes), default=0)
    if dims > hostio.MAX_DIMS:
        raise RuntimeError(f"{func}: tpu tensors have at most {hostio.MAX_DIMS} dims (numpy's limit), got {dims}")


_DECOMPOSED_CHECKED = _caches.memo("decomposed_checked")


def check_with_meta(func, args, kwargs) -> None:
    """torch's errors for a call about to be decomposed: the meta kernel's,
    and the CPU kernel's (Note [Kernel checks]); once per call signature."""
    args, kwargs = lift(func, args, kwargs)
    template, values = flatten(args, kwargs, pick)
    key = (func, template, tuple(value_key(v) for v in values))
    if key in _DECOMPOSED_CHECKED:
        return
    try:
        infer_meta(func, template, values)
    except MetaUnavailable:
        pass
    check_kernel_dtypes(func, template, values)
    _DECOMPOSED_CHECKED.add(key)


def map_tensors(x, kind, fn):
    """``fn`` applied to every ``kind`` tensor in nested lists/tuples
    (a module function: Note [No closure cycles])."""
    if isinstance(x, kind):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(map_tensors(y, kind, fn) for y in x)
    return x
