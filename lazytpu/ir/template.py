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


def _flatten_leaf(leaf, pick, values: list):
    if isinstance(leaf, (list, tuple)):
        return tuple(_flatten_leaf(x, pick, values) for x in leaf)
    value = pick(leaf)
    if value is None:
        return leaf
    values.append(value)
    return Slot(len(values) - 1)


def flatten(args: tuple, kwargs: dict, pick: Callable[[Any], Any]) -> tuple[Template, list]:
    """Split a call into a template and its values.

    ``pick(leaf)`` returns the value to put in a slot, or ``None`` to keep the
    leaf static.

    Note [No closure cycles]: the walkers are module functions, not nested
    recursive closures: a recursive closure is a reference cycle, and it
    would keep the call's tensors alive until the garbage collector runs
    (delaying frees and making buffer donation depend on GC timing).
    """
    values: list = []
    t_args = tuple(_flatten_leaf(a, pick, values) for a in args)
    # slots are numbered in sorted-name order, the order the template lists them
    t_kwargs = tuple((k, _flatten_leaf(kwargs[k], pick, values)) for k in sorted(kwargs))
    return Template(t_args, t_kwargs), values


def _fill_leaf(leaf, values):
    if type(leaf) is Slot:
        return values[leaf.index]
    if type(leaf) is tuple:
        return tuple(_fill_leaf(x, values) for x in leaf)
    return leaf


def fill(template: Template, values) -> tuple[tuple, dict]:
    """Inverse of ``flatten``: the call's ``(args, kwargs)``."""
    return tuple(_fill_leaf(a, values) for a in template.args), {k: _fill_leaf(v, values) for k, v in template.kwargs}
