"""``_foreach_*`` ops: recorded as one node (Note [Foreach nodes] in
``lazytpu.ir.foreach_node``), or run as one element op per list element where
that cannot be done (an element op with no rule, a target whose dtype or
shape differs from the result's, lists spanning devices)."""

from __future__ import annotations

import functools

import torch

from lazytpu import _caches
from lazytpu.engine import context
from lazytpu.frontend import metas, record
from lazytpu.frontend.checks.probe import cpu_error, split
from lazytpu.frontend.routes.inplace import functional_args
from lazytpu.frontend.schema import functional_of, is_inplace, view_kind
from lazytpu.frontend.tensor import LazyTensor
from lazytpu.frontend.windows import write_value
from lazytpu.ir import Node, Output, Scalar, Storage
from lazytpu.ir.foreach_node import ForeachPart, ForeachSpec, foreach_op
from lazytpu.ir.node import op_sig
from lazytpu.ir.source import location
from lazytpu.lowering import get_rule

aten = torch.ops.aten

# foreach overload name -> element overload names to try, in order
_OVERLOAD_ELEMENT = {
    "List": ("Tensor", "default"),
    "ScalarList": ("Scalar", "default"),
    "Tensor": ("Tensor", "default"),
    "Scalar": ("Scalar", "default"),
    "default": ("default",),
    "ScalarAndTensor": ("Scalar", "Tensor_Scalar"),
    "out": ("out",),
    "List_out": ("out",),
    "Tensor_out": ("out",),
    "Scalar_out": ("Scalar_out", "out"),
    "ScalarList_out": ("Scalar_out", "out"),
}
# functional pow's overloads are named by which operands are tensors
_POW_ELEMENT = {
    "List": "Tensor_Tensor",
    "Scalar": "Tensor_Scalar",
    "ScalarList": "Tensor_Scalar",
    "ScalarAndTensor": "Scalar",
    "List_out": "Tensor_Tensor_out",
    "Scalar_out": "Tensor_Scalar_out",
    "ScalarList_out": "Tensor_Scalar_out",
}


_CLAMPS = {"maximum": "clamp_min", "minimum": "clamp_max"}


def element_op(func):
    """The element op a ``_foreach_*`` overload applies, or None."""
    name = func._schema.name.split("::")[-1][len("_foreach_") :]
    inplace = name.endswith("_")
    base = name[:-1] if inplace else name
    if base == "norm":
        return aten.linalg_vector_norm.out if func._overloadname.endswith("out") else aten.linalg_vector_norm.default
    if base in _CLAMPS and func._overloadname.startswith("Scalar"):
        base = _CLAMPS[base]  # torch's foreach maximum/minimum of numbers clamp (maximum takes tensors only)
    packet = getattr(aten, base + ("_" if inplace else ""), None)
    if packet is None:
        return None
    candidates = _OVERLOAD_ELEMENT.get(func._overloadname, (func._overloadname,))
    if base == "pow" and not inplace:
        candidates = (_POW_ELEMENT.get(func._overloadname, func._overloadname),)
    for overload in candidates:
        if overload in packet.overloads():
            return getattr(packet, overload)
    return None


def _element_calls(func, element, args, kwargs) -> list[tuple[tuple, dict]]:
    """The foreach call split into one ``(args, kwargs)`` per list element."""
    # Positional foreach args beyond the element op's positional ones are
    # keyword-only there (e.g. addcmul's ``value``).
    n_positional = sum(1 for a in element._schema.arguments if not a.kwarg_only)
    names = [a.name for a in func._schema.arguments]
    element_kwargs = [a.name for a in element._schema.arguments if a.kwarg_only]
    head = args[:n_positional]
    tail = {}
    if "dtype" in names[:n_positional] and names.index("dtype") < len(args):  # _foreach_norm(self, ord, dtype)
        at = names.index("dtype")
        head, tail = args[:at], {"dtype": args[at]}
    for i, a in enumerate(args[n_positional:], n_positional):
        name = names[i]
        if name not in element_kwargs and len(element_kwargs) == 1:
            name = element_kwargs[0]  # e.g. foreach ``scalars`` -> ``value``
        if isinstance(a, torch.Tensor) and func._schema.arguments[i].name == "scalars":
            a = a.tolist()  # one scalar per element (a host read, as torch's own loop)
        tail[name] = a
    tail.update(kwargs)
    n = len(next(a for a in args if isinstance(a, (list, tuple))))
    for a, arg in zip(args, func._schema.arguments):  # ``scalars``, pow's ``exponent``
        if isinstance(a, (list, tuple)) and str(arg.type) == "List[number]" and len(a) != n:
            raise RuntimeError("Tensor list must have same number of elements as scalar list.")
    return [
        (
            tuple(a[i] if isinstance(a, (list, tuple)) else a for a in head),
            {k: (v[i] if isinstance(v, (list, tuple)) else v) for k, v in tail.items()},
        )
        for i in range(n)
    ]


@functools.cache
def _packed_scalars_at(func) -> int | None:
    """The position of ``scalars`` where it is one tensor (the ``.Tensor``
    overloads of ``_foreach_addcmul``/``_foreach_addcdiv``), else None."""
    for i, a in enumerate(func._schema.arguments):
        if a.name == "scalars" and str(a.type) == "Tensor":
            return i
    return None


def _check_packed_scalars(func, args, kwargs) -> None:
    """torch's checks of a packed ``scalars`` tensor: contiguous, one dimension, one scalar per list element."""
    at = _packed_scalars_at(func)
    if at is None:
        return
    scalars = args[at] if at < len(args) else kwargs["scalars"]
    if not scalars.is_contiguous():
        raise RuntimeError("Expected scalars to be contiguous.")
    if scalars.dim() != 1:
        raise RuntimeError(f"Expected packed scalar Tensor to be of dimension 1. Got {scalars.dim()} instead.")
    if scalars.numel() != len(args[0]):
        raise RuntimeError(
            f"Expected length of scalars to match input of length {len(args[0])} but got {scalars.numel()} instead."
        )


def run_foreach(func, args, kwargs):
    """``_foreach_op(lists...)``: one node when possible, else one element op
    call per list element. Returns the list of results (None for in-place ops),
    or NotImplemented when ``func`` applies no known element op."""
    _check_packed_scalars(func, args, kwargs)
    try:
        return _run_foreach(func, args, kwargs)
    except RuntimeError as exc:
        error = _complex_list_error(func, args, kwargs, exc)
        if error is None:
            raise
    raise error[0](error[1].replace("_cpu", "_tpu"))


# Note [Foreach errors of complex lists]: CPU's foreach loop runs the element
# kernel's dtype dispatch without the element op's own complex check:
# ``_foreach_maximum`` of complex lists raises NotImplementedError
# '"maximum_cpu" not implemented for 'ComplexFloat'' where ``torch.maximum``
# raises RuntimeError "maximum not implemented for complex tensors.". An
# element's error in a call with a complex tensor is replaced by the foreach
# op's own, from one-element CPU stand-ins, where its type differs.


def _complex_list_error(func, args, kwargs, exc: RuntimeError) -> tuple[type, str] | None:
    template, values = split(args, kwargs)
    if not any(v.is_complex() for v in values):
        return None
    error = cpu_error(func, template, values, lambda v: torch.ones((1,) * v.dim(), dtype=v.dtype))
    return None if error is None or error[0] is type(exc) else error


def _run_foreach(func, args, kwargs):
    element = element_op(func)
    inplace = is_inplace(func)
    if element is None and inplace and functional_of(func) is not None:
        # no in-place element op (``maximum_``): the functional foreach op, written back
        for target, result in zip(args[0], functional_of(func)(*args, **kwargs), strict=True):
            target.copy_(result)
        return None
    if element is None:
        return NotImplemented
    void = inplace or func._schema.returns == []  # in-place, or writing ``out=`` lists
    if inplace or not void:
        try:
            key, values = _call_key(func, args, kwargs)
        except _NotLazy:
            pass
        else:
            batch = _BATCHES.get(key)
            if batch is None:
                batch = _BATCHES[key] = _plan_batch(func, element, args, kwargs, inplace, values)
            if batch is not False:
                results = _record(batch, values)
                if results is not None:
                    return None if void else results
    results = [element(*call, **extra) for call, extra in _element_calls(func, element, args, kwargs)]
    return None if void else results


class _NotLazy(Exception):
    """A list holds a tensor that is not a tpu tensor (a CPU tensor, a tracing
    tensor of the compile backend): the call runs element by element."""


def _list_leaf(x, values: list):
    t = type(x)
    if t is LazyTensor:
        values.append(x)
        return x._lt_desc
    if t is float or t is complex:
        values.append(x)
        return t
    if isinstance(x, torch.Tensor):
        raise _NotLazy
    return x


def _key_leaf(a, values: list):
    """``record.key_leaf``, with every float a value (a foreach op's floats
    are lifted by its element ops: ``_plan_batch`` checks each is found)."""
    t = type(a)
    if t is float or t is complex:
        values.append(a)
        return t
    if t is int:  # static (in the key) and a value too: element ops lift ints (``steps + 1``)
        values.append(a)
        return a
    if t is list or t is tuple:
        return tuple([_list_leaf(x, values) for x in a])
    if t is not LazyTensor and isinstance(a, torch.Tensor) and a.dim():
        raise _NotLazy  # ``scalars`` as a CPU tensor: read per element, as torch's loop does
    return record.key_leaf(a, values)


def _call_key(func, args, kwargs) -> tuple[tuple, list]:
    """The foreach call's signature: argument layouts, scalar kinds, and which
    values are the same object (so that a plan mapping them to one input is
    reused only where they still are); and its values, in order."""
    values: list = []
    parts = [func, *[_key_leaf(a, values) for a in args]]
    if kwargs:
        parts.extend((k, _key_leaf(kwargs[k], values)) for k in sorted(kwargs))
    first: dict = {}
    pattern = tuple(map(first.setdefault, map(id, values), range(len(values))))
    return (tuple(parts), pattern), values


def _origins(args, kwargs) -> list:
    """For each value of ``_call_key``: the list index it came from, or None
    (a value passed once to the foreach op, shared by every element)."""
    origins: list = []
    for a in (*args, *(kwargs[k] for k in sorted(kwargs))):
        if isinstance(a, (list, tuple)):
            origins.extend(i for i, x in enumerate(a) if isinstance(x, (torch.Tensor, float, complex)))
        elif isinstance(a, (torch.Tensor, float, complex)) or type(a) is int:
            origins.append(None)
    return origins


class _Batch:
    """How a foreach call signature is recorded (Note [Foreach nodes]).

    ``recipe[k]`` is the call value that node input ``k`` reads; ``targets``
    (in-place ops) the call value each element writes; ``plans`` the element
    plans (output layouts); ``sig`` the node's interned signature.
    """

    __slots__ = ("recipe", "targets", "plans", "sig")

    def __init__(self, recipe, targets, plans, sig) -> None:
        self.recipe, self.targets, self.plans, self.sig = recipe, targets, plans, sig


# element op -> (functional op it records, its rule), or None when it cannot be batched
_BATCHABLE: dict = _caches.table("foreach_elements")
# foreach call signature -> its _Batch, or False (run element by element)
_BATCHES = _caches.memo("foreach_batches")


def _batchable(element):
    entry = _BATCHABLE.get(element, False)
    if entry is not False:
        return entry
    functional = functional_of(element) if is_inplace(element) else element
    rule = None
    if functional is not None and functional not in record.HANDLERS and view_kind(functional) is None:
        rule = get_rule(functional)
    entry = None if rule is None or rule.random else (functional, rule)
    _BATCHABLE[element] = entry
    return entry


def _plan_batch(func, element, args, kwargs, inplace: bool, values: list):
    """Plan each element as its own op would be (torch's errors included),
    then map the elements' inputs to the call's values; False when the call
    must run element by element."""
    entry = _batchable(element)
    if entry is None:
        return False
    functional, rule = entry
    origins = _origins(args, kwargs)
    plans, recipe, positions, targets = [], [], [], []
    where: dict = {}  # call value index -> node input
    for i, (call, extra) in enumerate(_element_calls(func, element, args, kwargs)):
        if inplace:
            record.check_with_meta(element, call, extra)  # torch's errors (e.g. result type can't be cast)
            targets.append(_find(call[0], i, values, origins))
            call, extra = functional_args(element, functional, call, extra)
        key, vals = record.plan_key(functional, call, extra)
        plan = record.PLANS.get(key)
        if plan is None:
            try:
                plan = record.make_plan(functional, call, extra, rule, vals)
            except metas.MetaUnavailable:
                return False
            record.PLANS[key] = plan
        if inplace and (plan.layout is not None or plan.descs[0].aval != values[targets[-1]]._lt_desc.aval):
            return False  # a cast or broadcast into the target: the element path writes it
        pos = []
        for v in vals:
            r = _find(v.value if type(v) is Scalar else v, i, values, origins)
            if r is None:
                return False  # a value the call does not hold as such (``scalars`` given as a tensor)
            if r not in where:
                where[r] = len(recipe)
                recipe.append(r)
            pos.append(where[r])
        plans.append(plan)
        positions.append(tuple(pos))
    if any(type(v) in (float, complex) and r not in where for r, v in enumerate(values)):
        return False  # a float some element keeps static (baked in its template): not a value of the call key
    spec = ForeachSpec(tuple(ForeachPart(p.template, ps, len(p.out_avals)) for p, ps in zip(plans, positions)))
    out_avals = tuple(a for p in plans for a in p.out_avals)
    sig = op_sig(foreach_op(func, functional), spec, out_avals)
    return _Batch(tuple(recipe), tuple(targets) if inplace else None, tuple(plans), sig)


def _find(obj, i: int, values: list, origins: list):
    """The index of ``obj`` among the call's values of element ``i``."""
    for r, v in enumerate(values):
        if v is obj and (origins[r] is None or origins[r] == i):
            return r
    return None


def _record(batch: _Batch, values: list):
    """Record the call as one node; None when this call's tensors span devices
    or an element writes what another reads (the element path keeps torch's order)."""
    try:
        index = record.device_index(values)
    except RuntimeError:  # lists spanning devices: torch's loop allows it
        return None
    if batch.targets is not None and _overlapping(batch, values):
        return None
    ctx = context(index)
    op, spec, out_avals = batch.sig.static
    graph = ctx.graph
    with graph.lock:
        inputs = []
        for r in batch.recipe:
            v = values[r]  # a tpu tensor, a CPU scalar tensor (torch.optim's tensor lr), or a number
            inputs.append(record.input_value(v, index) if isinstance(v, torch.Tensor) else Scalar(v))
        node = Node(op, spec, tuple(inputs), out_avals, location(3), batch.sig)
        results = []
        k = 0
        if batch.targets is not None:
            for t in batch.targets:
                write_value(values[t], Output(node, k), graph)  # never flushes: recorded() below does
                k += 1
        else:
            for plan in batch.plans:
                outs = [
                    LazyTensor(Storage(Output(node, k + i), graph, d.stride), d, True) for i, d in enumerate(plan.descs)
                ]
                results.append(plan.pack(outs))
                k += len(plan.descs)
        ctx.recorded(node)
    return results


def _overlapping(batch: _Batch, values: list) -> bool:
    """Whether an element writes a storage another element uses."""
    if len(batch.targets) == 1:
        return False  # one element reads all its inputs before it writes
    written = {id(values[t]._lt_storage): i for i, t in enumerate(batch.targets)}
    if len(written) != len(batch.targets):
        return True
    for r in batch.recipe:
        v = values[r]
        if type(v) is LazyTensor:
            owner = written.get(id(v._lt_storage))
            if owner is not None and batch.targets[owner] != r:
                return True
    return False
