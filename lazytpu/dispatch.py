"""From torch's dispatcher to the IR: every op on a ``tpu`` tensor lands here.

Order of resolution for an op (Note [Resolution order]):

1. a dispatch-level handler (device moves, ``copy_``, ``item``);
2. a view op: the output shares the input's storage (``aliasing``);
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
import re
import threading
import warnings

import torch
from torch._decomp import decomposition_table

from lazytpu import _caches, _config, debug, hostio, metas, metrics, scalars
from lazytpu.aliasing import (
    check_overlap,
    contiguous_strides,
    cpu_probe,
    new_tensor,
    new_tensor_of,
    read,
    rebind_metadata,
    view_of,
    write,
    write_value,
)
from lazytpu.engine import RNG_AVAL, STEPS_DUE, context, run_due_steps
from lazytpu.ir import Failed, Node, Output, Scalar, Storage
from lazytpu.ir.node import op_sig
from lazytpu.ir.template import Slot, Template, fill, flatten
from lazytpu.lowering import get_rule
from lazytpu.scalars import is_tpu_device
from lazytpu.tensor import LazyTensor, describe, set_dispatcher

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

_META_MEMO: dict = {}
_caches.register("meta_memo", _META_MEMO.clear)


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
    re-run on uninitialized CPU tensors of the same shapes, so that the error
    raised is the one CPU torch users see. If the CPU run succeeds where meta
    had no kernel (or a stricter one), ``MetaUnavailable`` is raised: the CPU
    run's shapes are not trusted, since they may depend on the (garbage) data.
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
            storage = torch.empty(v._lt_desc.storage_numel, dtype=v.dtype, device=device)
            return storage.as_strided(v.shape, v.stride(), v.storage_offset())
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device)

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
    )

    def __init__(self, func, template, meta_out, rule, device_index) -> None:
        metas = [meta_out] if isinstance(meta_out, torch.Tensor) else list(meta_out)
        tensors = [m for m in metas if isinstance(m, torch.Tensor)]
        self.descs = tuple(describe(m.shape, _value_stride(func, m), 0, m.numel(), m.dtype) for m in tensors)
        out_avals = tuple(d.aval for d in self.descs)
        self.random = rule.random
        if rule.random:  # Note [Random state]: the PRNG key is the last input and output
            n_slots = _count_slots(template)
            template = Template(template.args + (Slot(n_slots),), template.kwargs)
            out_avals = out_avals + (RNG_AVAL,)
        self.template = template
        self.out_avals = out_avals
        self.static = op_sig(func, template, out_avals)
        self.device_index = device_index
        self.scalar_check = None  # Note [Python integers wrap]: see scalars.per_call_check
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


_PLANS: dict = {}
_caches.register("record_plans", _PLANS.clear)
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


def record(func, args, kwargs, rule, into: LazyTensor | None = None):
    """Record ``func`` as one node; return LazyTensors of its pending outputs.

    With ``into`` (the target of an in-place op, a tensor owning its storage
    with exactly the layout of ``func``'s single output), the storage of
    ``into`` is re-bound to the output instead, and ``into`` is returned.
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
    with ctx.graph.lock:
        inputs = [
            (v._lt_storage.value if v._lt_window is None else read(v))
            if type(v) is LazyTensor
            else _input_value(v, index)
            for v in values
        ]
        if plan.random:
            inputs.append(ctx.rng_value())
        node = Node(func, plan.template, tuple(inputs), plan.out_avals, debug.location(3), plan.static)
        if plan.random:
            ctx.graph.rng = Output(node, len(plan.out_avals) - 1)
        if into is not None and plan.layout is None and plan.descs[0] is into._lt_desc:
            into._lt_storage.bind(Output(node, 0))  # an in-place op: no tensor in between
            ctx.recorded(node)
            return into
        graph = ctx.graph  # new_tensor_of, inlined: this is the per-op path
        outs = [LazyTensor(Storage(Output(node, i), graph, d.stride), d, index, True) for i, d in enumerate(plan.descs)]
        ctx.recorded(node)
    return plan.pack(outs)


def _make_plan(func, args, kwargs, rule, values) -> _Plan:
    args, kwargs = _lift(func, args, kwargs)
    template, flat_values = flatten(args, kwargs, _pick)
    if rule.random:
        _check_generator(kwargs)
    meta_out = infer_meta(func, template, flat_values)
    if rule.random:
        plan = _Plan(func, template, meta_out, rule, _kwarg_device_index(kwargs))
        plan.scalar_check = scalars.random_check(func, template)
        return plan
    _check_kernel_dtypes(func, template, flat_values)
    scalars.check_at_plan(func, args, kwargs, template, flat_values, meta_out)
    plan = _Plan(func, template, meta_out, rule, _kwarg_device_index(kwargs))
    plan.scalar_check = scalars.per_call_check(func, kwargs, template, flat_values, meta_out)
    return plan


def _check_generator(kwargs) -> None:
    """torch's ``check_generator``: a random op given a generator of another
    device raises (there are no tpu generators: torch has no Python hook to
    make one). Ignoring it would also put the generator in the program key."""
    generator = kwargs.get("generator")
    if generator is not None:
        raise RuntimeError(f"Expected a 'tpu' device type for generator but found '{generator.device.type}'")


# Errors of CPU kernels that meta kernels do not raise, and that do not
# depend on sizes (Note [Kernel checks]).
_KERNEL_ERRORS = re.compile(
    r"not (yet )?implemented for|same dtype|expected scalar type|Dimension out of range|destination dtypes match"
    r"|not supported for complex|p has to be greater than or equal to 1|alpha must not be a floating point"
    r"|only support floating point|Expected a floating point|handle types other than"
)


# Op families whose CPU kernels check what meta kernels skip, and that are
# safe to call on zero-size inputs.
_KERNEL_CHECKED = frozenset(
    {
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "bitwise_not",
        "bitwise_left_shift",
        "bitwise_right_shift",
        "__and__",
        "__or__",
        "__xor__",
        "__lshift__",
        "__rshift__",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "cumsum",
        "cumprod",
        "logcumsumexp",
        "max",
        "min",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "aminmax",
        "index_put",
        "clamp",
        "clamp_min",
        "clamp_max",
        "threshold",
        "add",  # a float alpha with bool tensors (meta checks it for the other integer dtypes only)
        "sub",
        "addcmul",
        "addcdiv",
        "lerp",
        "var",
        "std",
        "histc",
        "gelu",
        "silu",
        "softplus",
        "glu",
        "nll_loss_forward",
        "nll_loss2d_forward",
        "huber_loss",
        "binary_cross_entropy",
        "soft_margin_loss",
        # linear algebra (LAPACK kernels): floating and complex dtypes only
        "linalg_cholesky_ex",
        "cholesky_solve",
        "cholesky_inverse",
        "linalg_solve_triangular",
        "triangular_solve",
        "linalg_lstsq",
        "linalg_householder_product",
        "geqrf",
        "ormqr",
        # pointwise special functions (lowering/special.py, pointwise_ext.py): dtypes the CPU kernels lack
        "frac",
        "mish",
        "celu",
        "hardshrink",
        "hypot",
        "nextafter",
        "heaviside",
        "logaddexp",
        "logaddexp2",
        "igamma",
        "igammac",
        "gcd",
        "lcm",
        "mvlgamma",
        "special_zeta",
        "special_erfcx",
        "special_log_ndtr",
        "special_ndtri",
        "special_airy_ai",
        "special_bessel_j0",
        "special_bessel_j1",
        "special_bessel_y0",
        "special_bessel_y1",
        "special_modified_bessel_i0",
        "special_modified_bessel_i1",
        "special_modified_bessel_k0",
        "special_modified_bessel_k1",
        "special_scaled_modified_bessel_k0",
        "special_scaled_modified_bessel_k1",
        "special_spherical_bessel_j0",
        *(f"special_{kind}_polynomial_{p}" for kind in ("chebyshev", "shifted_chebyshev") for p in "tuvw"),
        "special_hermite_polynomial_h",
        "special_hermite_polynomial_he",
        "special_laguerre_polynomial_l",
        "special_legendre_polynomial_p",
    }
)


# Families whose CPU kernels return before checking the dtype when the input
# is empty: their check runs on one-element inputs of ones instead.
_KERNEL_CHECKED_ON_ONES = frozenset(
    {"_softmax", "_log_softmax", "round", "cholesky", "_linalg_eigh", "linalg_lu_factor_ex", "linalg_lu"}
)


def _check_kernel_dtypes(func, template, values) -> None:
    """Note [Kernel checks]: meta kernels skip some checks real kernels make
    (dtype support, mixed dtypes in mm, dim wrapping in softmax). Once per call
    signature, the op runs on CPU with every dimension 0 (no work); if that
    raises one of those size-independent errors, raise it now, as the
    backend's (``"bitwise_and_tpu" not implemented for 'Float'``). Kernels
    that return before their dtype check on empty inputs (softmax, eigh)
    run on one-element inputs of ones instead. ``make dtype-sweep`` lists
    the ops still missing (``tests/dtype_sweep.py``)."""

    family = func._schema.name.split("::")[-1]
    ones = family in _KERNEL_CHECKED_ON_ONES
    if family not in _KERNEL_CHECKED and not ones:
        return  # some CPU kernels crash (SIGFPE) on zero-size inputs: only known-safe families run
    tensors = [v for v in values if type(v) is not Scalar]
    if not tensors:
        return
    exact = all(v.numel() == 0 for v in tensors)  # empty inputs: the real call costs nothing

    def empty(v):
        if ones and not exact:
            return torch.ones((1,) * len(v.shape), dtype=v.dtype)
        return torch.empty(tuple(v.shape) if exact else (0,) * len(v.shape), dtype=v.dtype)

    error = scalars.cpu_error(func, template, values, empty)
    if error is not None and (exact or _KERNEL_ERRORS.search(error[1])):
        raise error[0](error[1].replace("_cpu", "_tpu")) from None


# -- views ---------------------------------------------------------------------


@functools.cache
def _view_kind(func) -> str | None:
    """``"view"`` for ops returning a view of their first argument, ``"inplace_view"``
    for ops changing their argument's own window (``t_``, ``squeeze_``, ...)."""
    returns, args = func._schema.returns, func._schema.arguments
    if not returns or not args or returns[0].alias_info is None or args[0].alias_info is None:
        return None
    if returns[0].alias_info.is_write:
        return "inplace_view" if func._schema.name.split("::")[-1] in _INPLACE_VIEW_OPS else None
    return "view"


_INPLACE_VIEW_OPS = frozenset({"t_", "transpose_", "squeeze_", "unsqueeze_", "as_strided_", "swapdims_", "swapaxes_"})


_VIEW_PLANS: dict = {}
_caches.register("view_plans", _VIEW_PLANS.clear)


def run_view(func, args, kwargs):
    """A view op: the outputs share the input's storage (no node is recorded).

    Returns None when torch's "view" changes the dtype to or from bool or
    complex32: those are computed as values instead. The output
    descriptions are planned once per call signature (Note [Plans]).
    """
    src = args[0]
    key, _ = _signature(func, args, kwargs)
    plan = _VIEW_PLANS.get(key)
    if plan is None:
        plan = _VIEW_PLANS[key] = _make_view_plan(func, args, kwargs, src)
    if plan is False:
        return None
    descs, container = plan
    storage, index = src._lt_storage, src._lt_index
    if container is None:
        return LazyTensor(storage, descs[0], index)
    return container(LazyTensor(storage, d, index) for d in descs)


def _make_view_plan(func, args, kwargs, src):
    template, values = flatten(args, kwargs, _pick)
    meta_out = infer_meta(func, template, values)
    metas = [meta_out] if isinstance(meta_out, torch.Tensor) else list(meta_out)
    if any(m.dtype != src.dtype and not _reinterpretable(func, src.dtype, m.dtype) for m in metas):
        return False
    nbytes = src._lt_desc.storage_numel * src.dtype.itemsize
    descs = tuple(describe(m.shape, m.stride(), m.storage_offset(), nbytes // m.dtype.itemsize, m.dtype) for m in metas)
    if isinstance(meta_out, torch.Tensor):
        return descs, None
    return descs, tuple if isinstance(meta_out, tuple) else list


_NOT_REINTERPRETED = frozenset({torch.bool, torch.complex32})
# Views that reinterpret their input's bytes; others whose schema may alias (``to.dtype``)
# convert when the dtype changes.
_REINTERPRETING = frozenset({aten.view.dtype, aten.view_as_real.default, aten.view_as_complex.default})


def _reinterpretable(func, src: torch.dtype, dst: torch.dtype) -> bool:
    """A dtype-changing view is a window on its base's storage (Note [Dtype views]),
    except for bool and complex32 (stored as complex64): those are computed as values."""
    return func in _REINTERPRETING and src not in _NOT_REINTERPRETED and dst not in _NOT_REINTERPRETED


def run_inplace_view(func, args, kwargs):
    self = args[0]
    template, values = flatten(args, kwargs, _pick)
    meta = infer_meta(func, template, values)
    rebind_metadata(self, view_of(self, meta.shape, meta.stride(), meta.storage_offset()))
    return self


# -- writes (in-place, out=) ---------------------------------------------------


def resize_to(dst: LazyTensor, shape, *, warn: bool = True) -> None:
    """Give ``dst`` a new shape as torch's ``resize_output`` does for ``out=``: ``resize_``
    (a contiguous window at the same offset of the same storage), with its warning."""
    shape = tuple(shape)
    if tuple(dst.shape) == shape:
        return
    if warn and dst.numel() != 0:
        warnings.warn(
            f"An output with one or more elements was resized since it had shape {list(dst.shape)}, "
            f"which does not match the required output shape {list(shape)}. This behavior is deprecated, "
            "and in a future PyTorch release outputs will not be resized unless they have zero elements. "
            "You can explicitly reuse an out tensor t by resizing it, inplace, to zero elements with "
            "t.resize_(0).",
            UserWarning,
            stacklevel=4,
        )
    _HANDLERS[aten.resize_.default](aten.resize_.default, (dst, list(shape)), {})


# In-place ops whose functional form has another name.
_FUNCTIONAL_NAMED = {aten.normal_.default: aten.normal_functional.default}


_IGNORED = frozenset({"dtype", "layout", "device", "pin_memory", "generator"})


def _arg_signature(schema, drop_out: bool) -> list[tuple[str, str]]:
    return [
        (a.name, str(a.type).replace("Optional[", "").rstrip("]"))
        for a in schema.arguments
        if not (drop_out and a.kwarg_only and a.alias_info is not None) and a.name not in _IGNORED
    ]


@functools.cache
def _functional_of(func):
    """The functional overload behind an in-place or out= overload, if any:
    same argument names and types (dtype/device options aside)."""
    if func in _FUNCTIONAL_NAMED:
        return _FUNCTIONAL_NAMED[func]
    schema = func._schema
    name = schema.name.split("::")[-1]
    base = name[:-1] if name.endswith("_") else name
    packet = getattr(aten, base, None)
    if packet is None:
        return None
    wanted = _arg_signature(schema, drop_out=True)
    for overload in packet.overloads():
        cand = getattr(packet, overload)
        if cand is func or cand._schema.is_mutable:
            continue
        if _arg_signature(cand._schema, drop_out=False) == wanted:
            return cand
    return None


def _call_functional(func, functional, args, kwargs, extra=None):
    """Call ``functional`` with ``func``'s arguments, plus the defaults of
    ``func`` for arguments the functional form requires (``bernoulli_(p=0.5)``
    has a default that ``bernoulli.p`` lacks)."""
    call_args, call_kwargs = _functional_args(func, functional, args, kwargs)
    if extra:
        call_kwargs = {**call_kwargs, **extra}
    return dispatch(functional, call_args, call_kwargs)


_RECIPES: dict = {}
_caches.register("functional_recipes", _RECIPES.clear)


def _functional_args(func, functional, args, kwargs) -> tuple[tuple, dict]:
    # keyed by id: OpOverload hashes in Python; overloads live as long as torch
    recipe_key = (id(func), len(args), tuple(kwargs))
    recipe = _RECIPES.get(recipe_key)
    if recipe is None:
        recipe = _RECIPES[recipe_key] = _functional_recipe(func, functional, len(args), tuple(kwargs))
    positional, named = recipe
    call_args = tuple(_take(src, args, kwargs) for src in positional)
    return call_args, {name: _take(src, args, kwargs) for name, src in named}


def _take(src, args, kwargs):
    kind, where = src
    if kind == "arg":
        return args[where]
    if kind == "kwarg":
        return kwargs[where]
    return where  # a default value


def _functional_recipe(func, functional, n_args: int, kwarg_names: tuple) -> tuple[tuple, tuple]:
    """Where each argument of ``functional`` comes from, for a call of
    ``func`` with ``n_args`` positional arguments and these keyword names:
    ``(positional sources, ((name, source), ...))``; a source is
    ``("arg", i)``, ``("kwarg", name)`` or ``("default", value)``."""
    given = {}
    defaults = {}
    for i, a in enumerate(func._schema.arguments):
        if a.kwarg_only and a.alias_info is not None:
            continue  # out=
        if i < n_args and not a.kwarg_only:
            given[a.name] = ("arg", i)
        elif a.name in kwarg_names:
            given[a.name] = ("kwarg", a.name)
        elif a.has_default_value():
            defaults[a.name] = ("default", a.default_value)
    call_args, call_kwargs = [], []
    positional = True  # until an argument is skipped, the rest can stay positional
    for a in functional._schema.arguments:
        if a.name in given:
            src = given[a.name]
        elif a.name in defaults and not a.has_default_value():
            src = defaults[a.name]
        else:
            positional = False
            continue
        if positional and not a.kwarg_only:
            call_args.append(src)
        else:
            call_kwargs.append((a.name, src))
    return tuple(call_args), tuple(call_kwargs)


def _out_args(func) -> list[str]:
    return [
        a.name for a in func._schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
    ]


def _is_inplace(func) -> bool:
    args = func._schema.arguments
    return bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write and not args[0].kwarg_only


# In-place ops known to run as their functional form (dispatch's fast path),
# and the call signatures of them already checked with the meta kernel.
_INPLACE: dict = {}
_caches.register("inplace_ops", _INPLACE.clear)
_INPLACE_CHECKED: set = set()
_caches.register("inplace_checked", _INPLACE_CHECKED.clear)


def _run_inplace(func, functional, args, kwargs):
    self = args[0]
    key, _ = _signature(func, args, kwargs)
    if key not in _INPLACE_CHECKED:
        _check_with_meta(func, args, kwargs)  # torch's errors (e.g. result type can't be cast)
        _INPLACE_CHECKED.add(key)
    if type(self) is LazyTensor:
        check_overlap(func, args, kwargs, self)
    rule = _RECORDED.get(functional)
    if rule is not None and type(self) is LazyTensor and self._lt_window is None:
        call_args, call_kwargs = _functional_args(func, functional, args, kwargs)
        try:
            result = record(functional, call_args, call_kwargs, rule, into=self)
        except MetaUnavailable:
            result = cpu_fallback(functional, call_args, call_kwargs, data_dependent=functional in DATA_DEPENDENT)
        if result is self:
            return self
    else:
        result = _call_functional(func, functional, args, kwargs)
    if isinstance(result, torch.Tensor) and not torch.can_cast(result.dtype, self.dtype):
        # torch's check, which some meta kernels skip (``int_tensor.mul_(3.0)``)
        raise RuntimeError(
            f"result type {_type_name(result.dtype)} can't be cast to the desired output type {_type_name(self.dtype)}"
        )
    write(self, result)
    return self


@functools.cache
def _type_name(dtype: torch.dtype) -> str:
    """torch's C++ name of ``dtype`` (``Float``, ``ComplexDouble``) as its error messages spell it."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")


_OUT_DTYPE_ERRORS = re.compile(r"dtype|type to be|can't be cast|floating point type|Expected .* type")
_OUT_DTYPES_CHECKED: dict = {}
_caches.register("out_dtypes_checked", _OUT_DTYPES_CHECKED.clear)


def _check_out_dtypes(func, args, kwargs) -> None:
    """torch's error for an ``out=`` tensor of a dtype the op refuses (each op has its own
    check and message; meta kernels skip most): the op runs once per call signature on CPU
    zeros of the same layouts."""
    key, _ = _signature(func, args, kwargs)
    if key not in _OUT_DTYPES_CHECKED:
        error = cpu_probe(func, args, kwargs)
        ok = error is None or not isinstance(error, (RuntimeError, TypeError))
        _OUT_DTYPES_CHECKED[key] = None if ok or not _OUT_DTYPE_ERRORS.search(str(error)) else error
    error = _OUT_DTYPES_CHECKED[key]
    if error is not None:
        raise type(error)(str(error)) from None


def _has_tensor(x) -> bool:
    if isinstance(x, (list, tuple)):
        return any(_has_tensor(y) for y in x)
    return isinstance(x, torch.Tensor)


# Reductions whose ``out=`` form without a ``dtype`` computes in the out tensor's dtype.
_OUT_SETS_DTYPE = frozenset({"sum", "nansum", "prod", "cumsum", "cumprod"})


def _out_dtype(func, functional, outs, kwargs) -> dict | None:
    """An ``out=`` factory (``linspace.out``, ``arange.start_out``) computes in
    its output's dtype: the functional form gets it as ``dtype``; so do
    ``sum``/``prod``/``cumsum`` given no ``dtype``."""
    if not (outs and type(outs[0]) is LazyTensor and _takes_dtype(functional)):
        return None
    if not _takes_dtype(func) or (kwargs.get("dtype") is None and func._schema.name.split("::")[-1] in _OUT_SETS_DTYPE):
        return {"dtype": outs[0].dtype}
    return None


def _takes_dtype(op) -> bool:
    return any(a.name == "dtype" for a in op._schema.arguments)


def _run_out(func, functional, args, kwargs):
    _check_generator(kwargs)
    names = _out_args(func)
    outs = [kwargs[n] for n in names]
    for dst in outs:
        if type(dst) is LazyTensor:
            check_overlap(func, args, kwargs, dst)
    result = _call_functional(func, functional, args, kwargs, _out_dtype(func, functional, outs, kwargs))
    results = [result] if isinstance(result, torch.Tensor) else list(result)
    if any(type(dst) is LazyTensor and dst.dtype != src.dtype for dst, src in zip(outs, results)):
        _check_out_dtypes(func, args, kwargs)
    # a factory (no tensor argument) resizes its out tensor silently, as torch's do
    warn = _has_tensor(args) or _has_tensor([v for k, v in kwargs.items() if k not in names])
    for dst, src in zip(outs, results):
        if type(dst) is not LazyTensor:
            raise RuntimeError(f"Expected out tensor to be on tpu, but found it on {dst.device}")
        resize_to(dst, src.shape, warn=warn)
        write(dst, src)
    return outs[0] if len(outs) == 1 else tuple(outs)


# -- CPU fallback --------------------------------------------------------------

_WARNED: set = set()
_caches.register("fallback_warnings", _WARNED.clear)


# Note [Data-dependent shapes]: ops whose output shape depends on values
# (nonzero, unique, masked_select, boolean-mask indexing, repeat_interleave
# without output_size) cannot be recorded: the inputs are synced (reason
# "data_dependent"), the op runs where the data now is, and recording goes on
# with its result. This is not a missing lowering, so it is not counted as a
# CPU fallback and works with LAZYTPU_CPU_FALLBACK=0.
DATA_DEPENDENT = frozenset(
    {
        aten.nonzero.default,
        aten.nonzero_static.default,
        aten.argwhere.default,
        aten.masked_select.default,
        aten._unique2.default,
        aten.unique_dim.default,
        aten.unique_consecutive.default,
        aten._unique.default,
        aten.repeat_interleave.Tensor,
        aten.index.Tensor,
        aten.index_put.default,
        aten.index_put_.default,
    }
)


def cpu_fallback(func, args, kwargs, *, data_dependent: bool = False):
    """Run ``func`` on CPU torch; copy mutated inputs and results back."""
    name = str(func)
    if data_dependent:
        reason = "data_dependent"
    else:
        if not _config.CPU_FALLBACK.get():
            raise NotImplementedError(
                f"lazytpu: no lowering for {func} and CPU fallback is off (LAZYTPU_CPU_FALLBACK=0)"
            )
        reason = "cpu_fallback"
        metrics.count("cpu_fallbacks", name)
        if name not in _WARNED:
            _WARNED.add(name)
            warnings.warn(f"lazytpu: {name} has no lowering; it runs on CPU (slower, splits the program)", stacklevel=3)
    lazies: list[LazyTensor] = []

    def to_cpu(x):
        lazies.append(x)
        return hostio.to_cpu(x, reason=reason)

    cargs = tuple(_map_tensors(a, LazyTensor, to_cpu) for a in args)
    ckwargs = {k: _map_tensors(v, LazyTensor, to_cpu) for k, v in kwargs.items()}
    if is_tpu_device(ckwargs.get("device")):
        ckwargs["device"] = "cpu"
    index = _device_index(lazies) if lazies else (_kwarg_device_index(kwargs) or 0)
    out = func(*cargs, **ckwargs)
    # write mutated arguments back
    written = {}
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            lazy = kwargs.get(arg.name) if arg.kwarg_only else (args[i] if i < len(args) else None)
            host = ckwargs.get(arg.name) if arg.kwarg_only else (cargs[i] if i < len(cargs) else None)
            if type(lazy) is LazyTensor:
                if tuple(lazy.shape) != tuple(host.shape):
                    resize_to(lazy, host.shape)
                write_value(lazy, hostio.data_from_cpu(host, index))
                written[id(host)] = lazy

    def back(x):
        if id(x) in written:
            return written[id(x)]
        return new_tensor(hostio.data_from_cpu(x, index), x.shape, contiguous_strides(x.shape), x.dtype, index)

    return _map_tensors(out, torch.Tensor, back)


def _map_tensors(x, kind, fn):
    """``fn`` applied to every ``kind`` tensor in nested lists/tuples
    (a module function: Note [No closure cycles])."""
    if isinstance(x, kind):
        return fn(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map_tensors(y, kind, fn) for y in x)
    return x


# -- foreach -------------------------------------------------------------------

# -- the dispatcher ------------------------------------------------------------


# Advanced indexing takes index tensors on the CPU for a tensor of any
# device, as on CUDA (``x[torch.randperm(n)]``, ``x[idx] = v``); other ops
# with index arguments (``index_select``, ``gather``) raise torch's device error.
_CPU_INDEX_OPS = frozenset(
    {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
)


def _indices_to_device(args):
    device = args[0].device
    indices = [
        i.to(device) if isinstance(i, torch.Tensor) and type(i) is not LazyTensor and i.dim() else i for i in args[1]
    ]
    return (args[0], indices, *args[2:])


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
    if func in _CPU_INDEX_OPS and len(args) > 1 and type(args[0]) is LazyTensor:
        args = _indices_to_device(args)
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


def _check_with_meta(func, args, kwargs) -> None:
    args, kwargs = _lift(func, args, kwargs)
    template, values = flatten(args, kwargs, _pick)
    try:
        infer_meta(func, template, values)
    except MetaUnavailable:
        pass


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

from lazytpu import foreach, handlers  # noqa: E402,F401  (handlers registers the dispatch-level handlers)
from lazytpu.foreach import run_foreach  # noqa: E402,F401  (also the compile backend's decomposition)
