"""``_foreach_*`` ops as one node (Note [Foreach nodes]).

Note [Foreach nodes]: torch.optim's default path on an accelerator calls
``_foreach_*`` ops, each applying one element op (``add_``, ``lerp_``,
``addcdiv_``, ...) to every tensor of a list. Recording one node per element
would cost one full recording per parameter and op (an AdamW step of a small
transformer is ~300 nodes); a foreach op is recorded as one node instead:
``op`` is a ``ForeachOp`` naming the element op, ``spec`` a ``ForeachSpec``
giving each element its template, the positions of its inputs among the
node's (a scalar or tensor passed once to the foreach op is one input of the
node, shared by every element) and its number of outputs. The lowering
applies the element's rule to each element in turn: the same XLA as the
per-element nodes, recorded in one step.
"""

from __future__ import annotations

from typing import Any

import attrs

from lazytpu import _caches


class ForeachOp:
    """The op of a foreach node: ``element`` applied to each list element.

    One object per foreach overload (``foreach_op``), compared by identity.
    """

    __slots__ = ("func", "element")

    def __init__(self, func: Any, element: Any) -> None:
        self.func = func  # the ``_foreach_*`` overload (for display)
        self.element = element  # the functional element op whose rule lowers each element

    def __repr__(self) -> str:
        return str(self.func)

    __str__ = __repr__


_OPS: dict = _caches.table("foreach_ops")


def foreach_op(func, element) -> ForeachOp:
    """The interned ``ForeachOp`` of ``func`` applying ``element``."""
    op = _OPS.get(func)
    if op is None:
        op = _OPS[func] = ForeachOp(func, element)
    return op


@attrs.frozen(slots=True)
class ForeachPart:
    """One element of a foreach node: its template (slots numbered among its
    own values), where those values are among the node's inputs, and how many
    outputs it has."""

    template: Any
    positions: tuple[int, ...]
    n_outputs: int


@attrs.frozen(slots=True)
class ForeachSpec:
    """The static structure of a foreach node: one ``ForeachPart`` per element."""

    parts: tuple[ForeachPart, ...]

    # the debug views show a spec's ``args`` and ``kwargs``
    @property
    def args(self) -> tuple:
        return ()

    @property
    def kwargs(self) -> tuple:
        return (("elements", len(self.parts)),)
