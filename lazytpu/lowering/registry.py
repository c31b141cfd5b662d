"""The lowering registry: aten op -> pure JAX rule.

    @lowering(aten.add.Tensor, aten.add.Scalar)
    def add(x, y, *, alpha=1):
        return x + alpha * y

A rule takes the op's arguments as the op's schema orders them, with tensors
replaced by JAX arrays; it returns an array or a tuple of arrays. Casting the
result to the dtype torch inferred, in-place forms and ``out=`` are handled
around the rules, never inside them. Random rules (``random=True``) also get
an explicit ``key`` keyword argument.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

from lazytpu._registry import Registry

_OpOverload = torch._ops.OpOverload
_OpPacket = torch._ops.OpOverloadPacket


@attrs.frozen(slots=True)
class Rule:
    fn: Callable
    random: bool = False


def _is_functional(op: _OpOverload) -> bool:
    schema = op._schema
    return not schema.is_mutable and not schema.name.endswith("_") and "out" not in op._overloadname


def expand(op) -> list[_OpOverload]:
    """An overload stays itself; a packet gives its functional overloads; a
    string names one of lazytpu's own IR ops (e.g. ``"lazytpu.view_read"``)."""
    if isinstance(op, (_OpOverload, str)):
        return [op]
    if isinstance(op, _OpPacket):
        overloads = [getattr(op, name) for name in op.overloads()]
        return [o for o in overloads if _is_functional(o)]
    raise TypeError(f"not an aten op: {op!r}")


RULES: Registry = Registry("lowering", expand=expand)  # op -> Rule

# The rule of an op, or None: the registry's own dict lookup (called per op).
get_rule: Callable[[object], Rule | None] = RULES.get


def lowering(*ops, random: bool = False) -> Callable[[Callable], Callable]:
    """Register ``fn`` as the lowering of ``ops`` (packets expand to overloads).

    Raises:
        ValueError: an op already has a rule.
    """
    return RULES.register(*ops, wrap=lambda fn: Rule(fn, random))


def registered_ops() -> frozenset:
    return frozenset(RULES)
