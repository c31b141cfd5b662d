"""Call templates: an op's arguments with the value slots left open.

``flatten`` turns ``(args, kwargs)`` into a hashable template plus the list of
values that fill its slots (tensors, lifted scalars); ``fill`` puts values
back. Lists and tuples are walked; everything else is a static leaf.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen(slots=True)
class Slot:
    """Placeholder for the ``index``-th value of a call."""

    index: int


@attrs.frozen(slots=True)
class Template:
    args: tuple
    kwargs: tuple  # sorted (name, value) pairs


def flatten(args: tuple, kwargs: dict, pick: Callable[[Any], Any]) -> tuple[Template, list]:
    """Split a call into a template and its values.

    ``pick(leaf)`` returns the value to put in a slot, or ``None`` to keep the
    leaf static.
    """
    values: list = []

    def walk(leaf):
        if isinstance(leaf, (list, tuple)):
            return tuple(walk(x) for x in leaf)
        value = pick(leaf)
        if value is None:
            return leaf
        values.append(value)
        return Slot(len(values) - 1)

    t_args = tuple(walk(a) for a in args)
    t_kwargs = tuple(sorted((k, walk(v)) for k, v in kwargs.items()))
    return Template(t_args, t_kwargs), values


def fill(template: Template, values) -> tuple[tuple, dict]:
    """Inverse of ``flatten``: the call's ``(args, kwargs)``."""

    def walk(leaf):
        if type(leaf) is Slot:
            return values[leaf.index]
        if type(leaf) is tuple:
            return tuple(walk(x) for x in leaf)
        return leaf

    return tuple(walk(a) for a in template.args), {k: walk(v) for k, v in template.kwargs}
