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

Note [Control flow]: ``torch.cond`` in a compiled function stays one node of
AOTAutograd's graphs (its forward and, for gradients, its backward), whose
branches are graphs of their own. It lowers to ``lax.cond`` of the branches,
each lowered as a graph is, so the program holds both and picks one on the
device: nothing is read, unlike eager ``torch.cond`` (Note [Higher-order
operators]), and the graph stays one program. ``while_loop`` (forward only,
as in torch) lowers to ``lax.while_loop`` of its condition and body the same
way; ``scan`` (its combine function takes the carry, one slice of each
``xs`` along dim 0 and the additional inputs, and returns the next carry and
the step's outputs, stacked) to ``lax.scan``, and ``map`` to ``lax.map``;
their gradients are scans and maps of their own in the backward graph. One
whose values are not all device tensors, or whose functions hold an op with
no lowering or a random op, is reported by ``missing_ops`` (the graph then
runs op by op, Note [Graphs that cannot lower]).
"""

from __future__ import annotations

import functools
import math
import operator

import jax.numpy as jnp
import torch

from lazytpu import _caches
from lazytpu._registry import Registry
from lazytpu.lowering import get_rule
from lazytpu.lowering.casts import convert

aten = torch.ops.aten
COND = torch.ops.higher_order.cond
# control-flow op -> (its kind, fn(*node.args) -> (its graphs, (its device values, as groups)))
CONTROL_FLOW = {
    COND: ("cond", lambda pred, on_true, on_false, operands: ((on_true, on_false), (pred, tuple(operands)))),
    torch.ops.higher_order.while_loop: (
        "while",
        lambda cond, body, carried, extra: ((cond, body), (tuple(carried), tuple(extra))),
    ),
    torch.ops.higher_order.scan: (
        "scan",
        lambda combine, init, xs, extra: ((combine,), (tuple(init), tuple(xs), tuple(extra))),
    ),
    torch.ops.higher_order.map_impl: ("map", lambda fn, xs, extra: ((fn,), (tuple(xs), tuple(extra)))),
}


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


def _on_device(x) -> bool:
    val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.device.type != "cpu"


def _control_flow_missing(gm: torch.fx.GraphModule, node) -> list[tuple[str, str]]:
    """What keeps a ``cond`` or ``while_loop`` node from lowering (Note [Control flow])."""
    graphs, groups = CONTROL_FLOW[node.target][1](*node.args)
    values = [v for group in groups for v in (group if isinstance(group, tuple) else (group,))]
    if not all(_on_device(v) or (node.target is COND and isinstance(v, bool)) for v in values):
        return [(f"{node.target.name()} of values not on the device", node.name)]
    out = []
    for branch in graphs:
        sub = functools.reduce(getattr, branch.target.split("."), gm)
        out += missing_ops(sub)
        for n in sub.graph.nodes:
            op = lowerable(n.target) if n.op == "call_function" and n.target not in GRAPH_RULES else None
            if op is not None and get_rule(op).random:
                out.append((f"random op {n.target} in a {node.target.name()} function", n.name))
    return out


def missing_ops(gm: torch.fx.GraphModule) -> list[tuple[str, str]]:
    """(op, FX node name) of every node with no way to lower it."""
    out = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            if node.target in CONTROL_FLOW:
                out += _control_flow_missing(gm, node)
            elif node.target not in GRAPH_RULES and lowerable(node.target) is None:
                out.append((str(node.target), node.name))
        elif node.op not in ("placeholder", "get_attr", "output"):
            out.append((f"{node.op} {node.target}", node.name))
    return out
