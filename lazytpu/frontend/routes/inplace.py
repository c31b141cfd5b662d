"""In-place and ``out=`` ops, run through their functional forms and written into their targets."""

from __future__ import annotations

import re
import warnings

import torch

from lazytpu import _caches
from lazytpu._dtypes import type_name
from lazytpu.frontend import hostio
from lazytpu.frontend.checks.overlap import check_overlap
from lazytpu.frontend.checks.probe import cpu_error, cpu_probe, split
from lazytpu.frontend.generator import own_generator
from lazytpu.frontend.metas import MetaUnavailable
from lazytpu.frontend.record import ROUTES, check_with_meta, plan_key, record
from lazytpu.frontend.routes.fallback import DATA_DEPENDENT, cpu_fallback
from lazytpu.frontend.routes.views import resize_to
from lazytpu.frontend.schema import out_args
from lazytpu.frontend.tensor import LazyTensor, redispatch
from lazytpu.frontend.windows import write

aten = torch.ops.aten


def _call_functional(func, functional, args, kwargs, extra=None):
    """Call ``functional`` with ``func``'s arguments, plus the defaults of
    ``func`` for arguments the functional form requires (``bernoulli_(p=0.5)``
    has a default that ``bernoulli.p`` lacks)."""
    call_args, call_kwargs = functional_args(func, functional, args, kwargs)
    if extra:
        call_kwargs = {**call_kwargs, **extra}
    return redispatch(functional, call_args, call_kwargs)


_RECIPES: dict = _caches.table("functional_recipes")


def functional_args(func, functional, args, kwargs) -> tuple[tuple, dict]:
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


# The call signatures of in-place ops already checked with the meta kernel.
_INPLACE_CHECKED = _caches.memo("inplace_checked")


def _written_several(func) -> tuple[str, ...]:
    """The names of the arguments ``func`` writes, when it writes more than
    one tensor (a list, or several arguments); empty otherwise.

    Note [Several written arguments]: an in-place op that writes a list or
    several arguments (GradScaler's ``_amp_foreach_non_finite_check_and_unscale_``
    and ``_amp_update_scale_``, QAT's ``_fused_moving_avg_obs_fq_helper``) has
    a functional form returning the op's own results, then the new value of
    each written argument, in schema order (torchgen's functional variants);
    each is written into its argument, resized first where the kernel resizes
    it (an empty per-channel statistic becomes one per channel). torch's
    checks of these ops live in their CPU kernels (dtypes, one-element
    tensors): they run once per call signature on stand-ins of ones, at most
    two elements along each dimension (Note [CPU probes]), so a model's
    gradients are not copied for them."""
    written = [a for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if len(written) == 1 and not isinstance(written[0].type, torch.ListType):
        return ()
    return tuple(a.name for a in written)


def _small_stand_in(v):
    """Ones (a switch read with ``item()`` is on: the checks behind it run), at most two along each
    dimension (a tensor of several elements still has several: a one-element check sees it)."""
    return torch.ones([min(n, 2) for n in v.shape], dtype=v.dtype)


def _switches_read(v):
    """``_small_stand_in``, but a one-element tensor's own value (a host read)."""
    return hostio.to_cpu(v) if type(v) is LazyTensor and v.numel() == 1 else _small_stand_in(v)


def _probe_error(func, args, kwargs, stand_in):
    error = cpu_error(func, *split(args, kwargs), stand_in=stand_in)
    return None if error is None or error[1].startswith("Could not run") else error  # not a missing CPU kernel


def _check_several(func, args, kwargs) -> None:
    """torch's checks (Note [Several written arguments]). A check that fails with the switches on may
    sit behind a switch that is off (the fused observer's dtype checks while observing): then the
    switches are read, and the call probed with them, at each call."""
    key, _ = plan_key(func, args, kwargs)
    if key in _INPLACE_CHECKED:
        return
    check_with_meta(func, args, kwargs)
    if _probe_error(func, args, kwargs, _small_stand_in) is None:
        _INPLACE_CHECKED.add(key)
    elif (error := _probe_error(func, args, kwargs, _switches_read)) is not None:
        raise error[0](error[1])


def _run_inplace_several(func, functional, args, kwargs, written: tuple[str, ...], own: int):
    """Note [Several written arguments]; ``own``: how many results are not written arguments."""
    _check_several(func, args, kwargs)
    call = dict(zip((a.name for a in func._schema.arguments), args), **kwargs)
    results = _call_functional(func, functional, args, kwargs)
    if len(written) == 1:  # one written list: the functional form returns one list
        results = (results,)
    for name, result in zip(written, results[own:]):
        targets = call[name]
        listed = isinstance(targets, (list, tuple))
        for dst, src in zip(targets, result) if listed else ((targets, result),):
            if type(dst) is not LazyTensor:
                raise RuntimeError(f"{func}: expected {name} to be on tpu, but found it on {dst.device}")
            if src.shape != dst.shape:  # the kernel resized it (an empty per-channel statistic)
                resize_to(dst, src.shape, warn=False)
            write(dst, src)
    if own:
        return tuple(results[:own])
    return args[0] if func._schema.returns else None


def inplace_runner(func, functional, route):
    """The runner of the in-place ``func`` through ``functional``, chosen once
    per op (its route); ``route(op)`` is dispatch's: the route of ``functional``."""
    written = _written_several(func)
    if written:
        own = sum(r.alias_info is None for r in func._schema.returns)
        return lambda f, a, k: _run_inplace_several(f, functional, a, k, written, own)
    return lambda f, a, k: run_inplace(f, functional, a, k, route)


def run_inplace(func, functional, args, kwargs, route):
    self = args[0]
    if type(self) is not LazyTensor and self.device.type != "tpu":  # a CPU 0-d target of tpu operands
        other = next((a.device for a in (*args, *kwargs.values()) if type(a) is LazyTensor), "tpu:0")
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {other} and {self.device}!"
        )
    key, _ = plan_key(func, args, kwargs)
    if key not in _INPLACE_CHECKED:
        with warnings.catch_warnings():  # some meta kernels resize self; the shape check below raises
            warnings.filterwarnings("ignore", "An output with one or more elements was resized")
            check_with_meta(func, args, kwargs)  # torch's errors (e.g. result type can't be cast)
        _INPLACE_CHECKED.add(key)
    if type(self) is LazyTensor:
        check_overlap(func, args, kwargs, self)
    known = ROUTES.get(functional) or route(functional)  # the first call writes into its target as every later one
    rule = known.rule if known is not None and known.kind == "recorded" else None
    if rule is not None and type(self) is LazyTensor:
        call_args, call_kwargs = functional_args(func, functional, args, kwargs)
        try:
            result = record(functional, call_args, call_kwargs, rule, into=self)
        except MetaUnavailable:
            result = cpu_fallback(functional, call_args, call_kwargs, data_dependent=functional in DATA_DEPENDENT)
        if result is self:
            return self
    else:
        result = _call_functional(func, functional, args, kwargs)
    if isinstance(result, torch.Tensor) and result.shape != self.shape:  # torch's check, which some meta kernels skip
        raise RuntimeError(
            f"output with shape {list(self.shape)} doesn't match the broadcast shape {list(result.shape)}"
        )
    if isinstance(result, torch.Tensor) and not torch.can_cast(result.dtype, self.dtype):
        # torch's check, which some meta kernels skip (``int_tensor.mul_(3.0)``)
        raise RuntimeError(
            f"result type {type_name(result.dtype)} can't be cast to the desired output type {type_name(self.dtype)}"
        )
    write(self, result)
    return self


_OUT_DTYPE_ERRORS = re.compile(
    r"dtype|type to be|can't be cast|floating point type|[Ee]xpected .* type|supports bool tensor for result"
    r"|implemented for complex tensors|non-boolean outputs|expected scalar_type"
    r"|and result must have the same scalar type"  # index_select
    r"|output values must be of same type as input|output indices must be of scalar type Long"  # kthvalue
    r"|not implemented for"  # the out tensor's dtype chose a kernel CPU lacks (nansum into Long, std into complex)
)
_OUT_DTYPES_CHECKED = _caches.memo("out_dtypes_checked")


def _check_out_dtypes(func, args, kwargs) -> None:
    """torch's error for an ``out=`` tensor of a dtype the op refuses (each op has its own
    check and message; meta kernels skip most): the op runs once per call signature on CPU
    zeros of the same layouts."""
    key, _ = plan_key(func, args, kwargs)
    if key not in _OUT_DTYPES_CHECKED:
        error = cpu_probe(func, args, kwargs)
        ok = error is None or not issubclass(error[0], (RuntimeError, TypeError))
        _OUT_DTYPES_CHECKED[key] = None if ok or not _OUT_DTYPE_ERRORS.search(error[1]) else error
    error = _OUT_DTYPES_CHECKED[key]
    if error is not None:
        raise error[0](error[1]) from None


def _has_tensor(x) -> bool:
    if isinstance(x, (list, tuple)):
        return any(_has_tensor(y) for y in x)
    return isinstance(x, torch.Tensor)


# Ranges whose ``out=`` tensor of the right number of elements keeps its shape and strides:
# torch resizes it only when the count differs, then fills it in its own order.
_FILLS_ITS_SHAPE = frozenset({"arange", "linspace", "logspace", "range"})

# Reductions whose ``out=`` form without a ``dtype`` computes in the out tensor's dtype
# (``mean`` into a float64 out tensor sums in float64, as CPU).
_OUT_SETS_DTYPE = frozenset({"sum", "nansum", "prod", "cumsum", "cumprod", "mean"})


def _out_dtype(func, functional, outs, kwargs) -> dict | None:
    """An ``out=`` factory (``linspace.out``, ``arange.start_out``) computes in
    its output's dtype: the functional form gets it as ``dtype``; so do
    ``sum``/``prod``/``cumsum`` given no ``dtype``."""
    if not (outs and type(outs[0]) is LazyTensor and _takes_dtype(functional)):
        return None
    name = func._schema.name.split("::")[-1]
    if not _takes_dtype(func) or (kwargs.get("dtype") is None and name in _OUT_SETS_DTYPE):
        if name == "mean" and not (outs[0].dtype.is_floating_point or outs[0].dtype.is_complex):
            return None  # torch's "can't be cast" (_check_out_dtypes), not mean's dtype error
        return {"dtype": outs[0].dtype}
    return None


def _takes_dtype(op) -> bool:
    return any(a.name == "dtype" for a in op._schema.arguments)


def run_out(func, functional, args, kwargs):
    own_generator(args, kwargs)  # torch's error for a generator of another device, before any write
    names = out_args(func)
    outs = [kwargs[n] for n in names]
    listed = len(outs) == 1 and isinstance(outs[0], (list, tuple))  # ``Tensor(a!)[] out`` (split_copy)
    if listed:
        outs = list(outs[0])
    for dst in outs:
        if type(dst) is LazyTensor:
            check_overlap(func, args, kwargs, dst)
    out_dtype = _out_dtype(func, functional, outs, kwargs)
    result = _call_functional(func, functional, args, kwargs, out_dtype)
    results = [result] if isinstance(result, torch.Tensor) else list(result)
    if out_dtype or any(type(dst) is LazyTensor and dst.dtype != src.dtype for dst, src in zip(outs, results)):
        _check_out_dtypes(func, args, kwargs)
    # a factory (no tensor argument) resizes its out tensor silently, as torch's do
    warn = _has_tensor(args) or _has_tensor([v for k, v in kwargs.items() if k not in names])
    fills = func._schema.name.split("::")[-1] in _FILLS_ITS_SHAPE
    for dst, src in zip(outs, results):
        if type(dst) is not LazyTensor:
            raise RuntimeError(f"Expected out tensor to be on tpu, but found it on {dst.device}")
        if fills and dst.numel() == src.numel() and dst.shape != src.shape:
            src = aten.reshape.default(src, dst.shape)
        if dst.shape != src.shape:
            resize_to(dst, src.shape, warn=warn)
            if dst.stride() != src.stride() and torch._prims_common.is_non_overlapping_and_dense_or_false(src):
                # torch's TensorIterator gives a resized out tensor the layout it computed (a
                # permuted input's): so does the functional result's meta kernel
                aten.as_strided_.default(dst, src.shape, src.stride(), dst.storage_offset())
        write(dst, src)
    if listed:
        return None
    return outs[0] if len(outs) == 1 else tuple(outs)
