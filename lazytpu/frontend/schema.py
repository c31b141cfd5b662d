"""Facts read from an op's schema: view kind, in-place form, ``out=`` arguments, functional form.

Each is a pure function of the ``OpOverload``, memoized: the routes and the
resolver ask them for every op they see.
"""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten


@functools.cache
def view_kind(func) -> str | None:
    """``"view"`` for ops returning a view of their first argument, ``"inplace_view"``
    for ops changing their argument's own window (``t_``, ``squeeze_``, ...)."""
    returns, args = func._schema.returns, func._schema.arguments
    if not returns or not args or returns[0].alias_info is None or args[0].alias_info is None:
        return None
    if returns[0].alias_info.is_write:
        return "inplace_view" if func._schema.name.split("::")[-1] in _INPLACE_VIEW_OPS else None
    return "view"


_INPLACE_VIEW_OPS = frozenset({"t_", "transpose_", "squeeze_", "unsqueeze_", "as_strided_", "swapdims_", "swapaxes_"})


def is_inplace(func) -> bool:
    """Whether ``func`` writes its first (positional) argument in place."""
    args = func._schema.arguments
    return bool(args) and args[0].alias_info is not None and args[0].alias_info.is_write and not args[0].kwarg_only


def writes_arguments(func) -> bool:
    """Whether ``func`` writes some of its positional arguments in place (its first, or
    others: the running statistics of ``_fused_moving_avg_obs_fq_helper``)."""
    return any(a.alias_info is not None and a.alias_info.is_write and not a.kwarg_only for a in func._schema.arguments)


def out_args(func) -> list[str]:
    """The names of ``func``'s ``out=`` arguments."""
    return [
        a.name for a in func._schema.arguments if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
    ]


# In-place ops whose functional form has another name.
_FUNCTIONAL_NAMED = {
    aten.normal_.default: aten.normal_functional.default,
    aten._fused_moving_avg_obs_fq_helper.default: aten._fused_moving_avg_obs_fq_helper_functional.default,
}


# Options a functional form may lack; not ``generator``: the functional form of
# ``randperm.generator_out`` must take it on (Note [tpu generators]).
_IGNORED = frozenset({"dtype", "layout", "device", "pin_memory"})


def _arguments_key(schema, drop_out: bool) -> list[tuple[str, str]]:
    return [
        (a.name, str(a.type).replace("Optional[", "").rstrip("]"))
        for a in schema.arguments
        if not (drop_out and a.kwarg_only and a.alias_info is not None) and a.name not in _IGNORED
    ]


@functools.cache
def functional_of(func):
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
    wanted = _arguments_key(schema, drop_out=True)
    for overload in packet.overloads():
        cand = getattr(packet, overload)
        if cand is func or cand._schema.is_mutable:
            continue
        if _arguments_key(cand._schema, drop_out=False) == wanted:
            return cand
    return None
