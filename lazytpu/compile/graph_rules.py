"""Graph rules: the FX call targets that are structure, not math, and how
any FX node finds its lowering.

Note [FX node resolution]: a ``call_function`` node resolves, in order, to

1. a graph rule (``GRAPH_RULES``): structure an FX graph carries that eager
   never records (``getitem``, aliases, size queries, Python arithmetic on
   sizes, the functional ``copy``);
2. the op's lowering rule, applied with ``apply_op``: the rules, result
   casting and PRNG-key threading of eager, unchanged;
3. for a view op (functional in an AOTAutograd graph): its ``*_copy`` rule.

Any other node is reported by ``missing_ops`` before anything is compiled.
"""

from __future__ import annotations

import math
import operator

import jax.numpy as jnp
import torch

from lazytpu import _caches
from lazytpu._registry import Registry
from lazytpu.lowering import get_rule
from lazytpu.lowering.casts import convert

aten = torch.ops.aten


# -- graph rules (Note [FX node resolution], step 1) ---------------------------

GRAPH_RULES = Registry("graph rule")  # FX call target -> fn(target, *args)


def graph_rule(*targets):
    """Register ``fn`` for FX call targets that are structure, not math."""
    return GRAPH_RULES.register(*targets)


# Python arithmetic and comparisons on sizes (dynamic shapes), and getitem.
_PYTHON_OPS = tuple(getattr(operator, name) for name in "getitem add sub mul floordiv truediv mod neg pow".split())
_PYTHON_OPS += tuple(getattr(operator, name) for name in "eq ne lt le gt ge".split())
_PYTHON_OPS += (torch.sym_max, torch.sym_min, torch.sym_not, math.ceil, math.floor)
graph_rule(*_PYTHON_OPS)(lambda fn, *args: fn(*args))


ALIASES = (aten.alias.default, aten.detach.default, aten.lift_fresh.default)


@graph_rule(*ALIASES)
def _identity(fn, x):
    return x


@graph_rule(aten.sym_size.int)
def _sym_size(fn, x, dim):
    return x.shape[dim]


@graph_rule(aten.sym_numel.default)
def _sym_numel(fn, x):
    return math.prod(x.shape)


@graph_rule(aten.copy.default, aten.copy_.default)  # copy_: an input mutation (Note [Input mutations] in fx_lowering)
def _copy(fn, x, src, non_blocking=False):
    return convert(jnp.broadcast_to(src, x.shape), x.dtype)


def is_view_node(op) -> bool:
    returns, args = op._schema.returns, op._schema.arguments
    return bool(returns and args) and returns[0].alias_info is not None and not returns[0].alias_info.is_write


_LOWERABLE: dict = _caches.table("compile_lowerable")


def lowerable(op):
    """The op whose lowering rule computes ``op`` (itself or its ``*_copy``
    form), or None."""
    if op not in _LOWERABLE:
        found = op if get_rule(op) is not None else None
        if found is None and isinstance(op, torch._ops.OpOverload) and is_view_node(op):
            packet = getattr(aten, op._schema.name.split("::")[-1] + "_copy", None)
            overload = getattr(packet, op._overloadname, None) if packet is not None else None
            found = overload if overload is not None and get_rule(overload) is not None else None
        _LOWERABLE[op] = found
    return _LOWERABLE[op]


def missing_ops(gm: torch.fx.GraphModule) -> list[tuple[str, str]]:
    """(op, FX node name) of every node with no way to lower it."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            if node.target not in GRAPH_RULES and lowerable(node.target) is None:
                out.append((str(node.target), node.name))
        elif node.op not in ("placeholder", "get_attr", "output"):
            out.append((f"{node.op} {node.target}", node.name))
    return out
