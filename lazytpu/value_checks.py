"""torch's checks of values, by default, without a wait (issue: no silent wrong results).

Note [Value checks]: some of CPU torch's checks read data: an index out of
range (``x[i]``, gather/scatter, index_select/add/copy/fill, take/put,
embedding), an ``nll_loss``/``cross_entropy`` target out of range, negative
or non-finite ``multinomial`` probabilities, ``bernoulli`` probabilities
outside [0, 1], a negative ``normal`` std, an integer division by zero. On
``tpu`` the data is not on the host when the op is recorded, and reading it
there would cut the program and make the host wait for the device at every
such op. Instead each checked op records, beside itself, a
``lazytpu.value_check`` node per checked tensor (lowering/checks.py): two
scalars computed inside the same program, the position of the first bad
element (or -1) and its value. They are read at the next host read
(``.cpu()``, ``.item()``, ``print``), once that read has waited for its own
program, and never waited for otherwise (a flush reads those already
computed). A bad element raises torch's own error: the op runs on CPU with
data-free stand-ins and an index (or probability) tensor that holds the bad
value alone, so that torch itself writes the message, and lazytpu adds the
op and the user's ``file:line``. The values that depend on the op (in the
program that computed it) fail with that error (Note [Failure isolation]).
``LAZYTPU_DEBUG=bounds`` checks the index ops on the host instead
(lazytpu.bounds), at the cost of a blocking read per op.

A rule below says, from an op's arguments (shapes and dims only), which
tensors to check, with which predicate and bounds; it runs once per call
signature (Note [Plans] in dispatch), so the per-call cost is the check
nodes.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import attrs
import torch

from lazytpu import _config
from lazytpu.ir import Aval, Data, Node, Output, Storage
from lazytpu.ir.template import Slot, Template, fill
from lazytpu.lowering.checks import VALUE_CHECK

aten = torch.ops.aten

_RULES: dict = {}


def checks(*ops) -> Callable[[Callable], Callable]:
    """Register ``fn(*args, **kwargs) -> [(tensor, kind, params, fill)]`` as the
    value checks of ``ops``; ``fill`` is a value every element may hold."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            if op in _RULES:
                raise ValueError(f"value checks for {op} are already registered")
            _RULES[op] = fn
        return fn

    return register


@attrs.frozen(slots=True)
class Check:
    """One checked tensor of an op: ``values[leaf]`` of its call."""

    leaf: int
    kind: str
    params: tuple
    fill: float | int


class ValuePlan:
    """The value checks of one call signature, and how to replay the op on CPU."""

    __slots__ = ("func", "template", "stand_ins", "checks")

    def __init__(self, func, template, stand_ins: list, checks: tuple[Check, ...]) -> None:
        self.func, self.template, self.stand_ins, self.checks = func, template, stand_ins, checks

    def record(self, ctx, node: Node | None, inputs: list, source=None, outputs: tuple = ()) -> None:
        """Record the check nodes of one call of the op ``node`` (Note [Value checks]).

        ``node=None``: the op's ``outputs`` (storages) are materialized already
        (a decomposed op in strict mode); ``source`` says where it was recorded."""
        if not _config.VALUE_CHECKS.value:
            return
        for check in self.checks:
            x = inputs[check.leaf]
            template = Template((Slot(0),), (("kind", check.kind), ("params", check.params)))
            avals = (Aval((), torch.int64), Aval((), x.aval.dtype))
            probe = Node(VALUE_CHECK, template, (x,), avals, node.source if node is not None else source)
            position = Storage(Output(probe, 0), ctx.graph, ())
            value = Storage(Output(probe, 1), ctx.graph, ())
            pending = PendingValueCheck(self, check, node if node is not None else probe, position, value)
            if node is None:  # fail them with the probe's own result (Note [Failure isolation])
                pending.extra = [
                    (weakref.ref(s), position.value, weakref.ref(s.value.buffer))
                    for s in outputs
                    if type(s.value) is Data
                ]
            ctx.watch_values(pending)  # not counted as a recorded op: the op it checks is

    def error(self, check: Check, position: int, value) -> BaseException:
        """torch's error for ``value`` at flat ``position`` of the checked tensor."""
        shape, dtype = self.stand_ins[check.leaf]
        bad = torch.full(shape, check.fill, dtype=dtype)
        if check.kind == "row_sums":  # the whole row sums to <= 0
            rows = bad.view(-1, shape[-1] if shape else 1)
            rows[position // rows.shape[1]] = 0
        else:
            bad.view(-1)[position] = value
        leaves = [
            bad if i == check.leaf else (torch.zeros((), dtype=s[1]).expand(s[0]) if type(s) is tuple else s)
            for i, s in enumerate(self.stand_ins)
        ]
        args, kwargs = fill(self.template, leaves)
        state = torch.random.get_rng_state()
        try:
            with torch.no_grad():
                self.func(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - torch's own error is what we want
            return exc
        finally:
            torch.random.set_rng_state(state)
        return RuntimeError(f"{self.func}: value {value} at position {position} is not valid")


@attrs.define(slots=True)
class PendingValueCheck:
    """A value check in flight: recorded, then computed by a flush, then read.

    ``roots`` and ``settled`` are the flush's (set by the engine): which
    values to fail with the check's error."""

    plan: ValuePlan
    check: Check
    node: Node
    position: Storage
    value: Storage
    roots: list | None = None
    settled: list | None = None
    extra: list = attrs.Factory(list)


def plan(func, args, kwargs, template, values: list) -> ValuePlan | None:
    """The value checks of a call signature, or None (most ops)."""
    rule = _RULES.get(func)
    if rule is None or "bounds" in _config.DEBUG.value and func in HOST_CHECKED:
        return None
    found = []
    for tensor, kind, params, fill_value in rule(*args, **kwargs):
        leaf = next((i for i, v in enumerate(values) if v is tensor), None)
        if leaf is not None and tensor.numel():
            found.append(Check(leaf, kind, tuple(params), fill_value))
    if not found:
        return None
    stand_ins = [(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else v.value for v in values]
    return ValuePlan(func, template, stand_ins, tuple(found))


def _integral(t) -> bool:
    return (
        isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex() and t.dtype is not torch.bool
    )


def _size(t: torch.Tensor, dim: int) -> int:
    return t.shape[dim] if t.dim() else 1


def _index_range(t: torch.Tensor, dim: int, index) -> list:
    """``index`` must lie in ``[0, size)`` of ``t``'s dim ``dim``."""
    return [(index, "range", (0, _size(t, dim)), 0)] if _integral(index) else []


@checks(aten.index.Tensor, aten.index_put.default, aten._unsafe_index.Tensor, aten._unsafe_index_put.default)
def _advanced_index(self, indices, *rest, **kwargs):
    found, dim = [], 0
    for index in indices:
        if index is not None and index.dtype in (torch.bool, torch.uint8):
            dim += index.dim()  # a mask (made indices before it reaches here)
            continue
        if _integral(index):
            size = _size(self, dim)
            found.append((index, "range", (-size, size), 0))
        dim += 1
    return found


@checks(
    aten.gather.default,
    aten.index_select.default,
    aten.scatter.src,
    aten.scatter.value,
    aten.scatter.reduce,
    aten.scatter.value_reduce,
    aten.scatter_add.default,
    aten.scatter_reduce.two,
    aten.index_add.default,
    aten.index_copy.default,
    aten.index_fill.int_Tensor,
    aten.index_fill.int_Scalar,
)
def _index_along(self, dim, index, *rest, **kwargs):
    return _index_range(self, dim, index)


@checks(aten.embedding.default)
def _embedding(weight, indices, *rest, **kwargs):
    return _index_range(weight, 0, indices)


@checks(aten.take.default, aten.put.default)
def _flat_index(self, index, *rest, **kwargs):
    n = self.numel()
    return [(index, "range", (-n, n), 0)] if _integral(index) else []


@checks(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def _targets(self, target, weight, reduction, ignore_index):
    classes = self.shape[1] if self.dim() >= 2 else _size(self, 0)
    return [(target, "range", (0, classes, ignore_index), 0)] if _integral(target) else []


@checks(aten.one_hot.default)
def _one_hot(self, num_classes=-1):
    return [(self, "range", (0, num_classes), 0)] if num_classes >= 0 and _integral(self) else []


@checks(aten.masked_fill.Tensor)
def _fill_value(self, mask, value):
    """A floating fill value must fit an integer tensor (torch reads it with ``item()``)."""
    if not (_integral(self) and isinstance(value, torch.Tensor) and value.is_floating_point()):
        return []
    info = torch.iinfo(self.dtype)
    return [(value, "fits", (info.min, info.max), 0)]


@checks(aten.multinomial.default)
def _multinomial(self, *rest, **kwargs):
    return [(self, "probability", (), 1), (self, "row_sums", (), 1)]


@checks(aten.bernoulli.default)
def _bernoulli(self, **kwargs):
    return [(self, "unit_interval", (), 0.5)]


@checks(aten.bernoulli.Tensor)
def _bernoulli_tensor(self, p, **kwargs):
    return [(p, "unit_interval", (), 0.5)] if isinstance(p, torch.Tensor) else []


@checks(aten.normal.Tensor_Tensor, aten.normal.float_Tensor)
def _normal(mean, std, **kwargs):
    return [(std, "non_negative", (), 1)] if isinstance(std, torch.Tensor) else []


@checks(aten.div.Tensor_mode, aten.remainder.Tensor, aten.fmod.Tensor, aten.floor_divide.default)
def _integer_division(self, other, **kwargs):
    if kwargs.get("rounding_mode", "floor") is None or not (_integral(self) and _integral(other)):
        return []
    return [(other, "nonzero", (), 1)]


# the ops lazytpu.bounds checks on the host instead when LAZYTPU_DEBUG has "bounds"
HOST_CHECKED = (
    aten.index.Tensor,
    aten.index_put.default,
    aten.gather.default,
    aten.index_select.default,
    aten.embedding.default,
    aten.scatter.src,
    aten.scatter.value,
    aten.scatter_add.default,
    aten.scatter_reduce.two,
    aten.index_add.default,
    aten.index_copy.default,
    aten.take.default,
    aten.nll_loss_forward.default,
)
