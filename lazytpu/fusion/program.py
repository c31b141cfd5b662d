"""Build a canonical ``Program`` from the roots a sync must materialize."""

from __future__ import annotations

from typing import Any

import attrs

from lazytpu.fusion.specialize import specialize
from lazytpu.ir.node import Aval, Data, Failed, Node, Output, Scalar
from lazytpu.ir.source import source_text

# A reference inside a program: ("in", i) is the i-th input, (j, k) is the
# k-th output of the j-th op.
Ref = tuple


@attrs.frozen(slots=True)
class ProgramOp:
    op: Any
    spec: Any
    inputs: tuple[Ref, ...]
    out_avals: tuple[Aval, ...]
    source: str | None


class Program:
    """A pure computation: inputs by position, ops in order, outputs by ref.

    ``ops`` is built on first use (a compile, an error, a debug view): a sync
    whose program is already compiled needs only the key and the inputs.
    """

    __slots__ = ("key", "input_kinds", "outputs", "_nodes", "_refs", "_ops")

    def __init__(self, key: tuple, nodes: list, refs: list, input_kinds: tuple, outputs: tuple) -> None:
        self.key = key
        # Aval for buffers, float/int/complex for lifted numbers, Constant for those compiled in
        # (Note [Scalar specialization] in lazytpu.fusion.specialize)
        self.input_kinds = input_kinds
        self.outputs = outputs
        self._nodes, self._refs, self._ops = nodes, refs, None

    @property
    def ops(self) -> tuple[ProgramOp, ...]:
        if self._ops is None:
            self._ops = tuple(
                ProgramOp(n.op, n.spec, r, n.out_avals, source_text(n.source)) for n, r in zip(self._nodes, self._refs)
            )
            self._nodes = self._refs = None  # the nodes hold input buffers: do not keep them
        return self._ops

    @property
    def output_avals(self) -> tuple[Aval, ...]:
        return tuple(self.ops[j].out_avals[k] for j, k in self.outputs)


class FailedInput(Exception):
    """A node reads a value that could not be computed (Note [Failure isolation])."""

    def __init__(self, node: Node, error: BaseException) -> None:
        super().__init__(f"lazytpu: an input of {node.op} could not be computed earlier: {error}")
        self.node = node
        self.error = error


def _topo_order(roots: list[Output]) -> list[Node]:
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(r.node, False) for r in reversed(roots)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for v in reversed(node.inputs):
            if type(v) is Output and id(v.node) not in seen:
                stack.append((v.node, False))
    return order


def build_program(roots: list[Output], specialize_numbers: bool = True) -> tuple[Program, list, list[Output]]:
    """Collect everything ``roots`` depend on. ``specialize_numbers=False``
    keeps every lifted number a runtime input (Note [Numbers of multi-process
    programs]).

    Returns:
        The program, the runtime values of its inputs (device buffers and
        Python scalars, in input order), and the distinct roots in output
        order.
    """
    nodes = _topo_order(roots)
    position = {id(n): j for j, n in enumerate(nodes)}
    inputs: list = []
    kinds: list = []
    buffer_slot: dict[int, int] = {}
    all_refs = []
    key_parts = []
    scalar_at: list[int] = []
    scalar_values: list = []
    for node in nodes:
        refs = []
        for v in node.inputs:
            kind = type(v)
            if kind is Output:
                refs.append((position[id(v.node)], v.index))
            elif kind is Data:
                slot = buffer_slot.get(id(v.buffer))
                if slot is None:
                    slot = buffer_slot[id(v.buffer)] = len(inputs)
                    inputs.append(v.buffer)
                    kinds.append(v.aval)
                refs.append(("in", slot))
            elif kind is Scalar:
                scalar_at.append(len(inputs))
                scalar_values.append(v.value)
                refs.append(("in", len(inputs)))
                inputs.append(v.value)
                kinds.append(v.kind)
            elif kind is Failed:
                raise FailedInput(node, v.error)
            else:
                raise TypeError(f"bad IR input {v!r}")
        refs = tuple(refs)
        all_refs.append(refs)
        key_parts.append((node.sig, refs))
    distinct = list(dict.fromkeys(roots))
    outputs = tuple((position[id(r.node)], r.index) for r in distinct)
    kinds = tuple(kinds)
    key = (tuple(key_parts), kinds, outputs)
    if scalar_at and specialize_numbers:
        key, kinds = specialize(key, kinds, scalar_at, scalar_values)
    return Program(key, nodes, all_refs, kinds, outputs), inputs, distinct


# Note [Failure isolation]: when a program fails, only the values that depend
# on the failing op fail with it. If the failing op is known (a node that
# reads a failed value, a lowering rule that raised, a deferred check), the
# roots split into those that reach it and the rest, which run again as a
# program of their own; if it is not (XLA failed to compile or run the
# program), the roots are halved until each failing part holds one root.
# In-place updates of materialized tensors (parameters, optimizer state) are
# roots like any other, so an unrelated failure never loses them.


def op_node(roots: list[Output], index: int) -> Node:
    """The node at position ``index`` of the program ``build_program(roots)``
    made (a lowering error names an op by its position)."""
    return _topo_order(roots)[index]


def split_roots(roots: list[Output], culprits) -> tuple[list[Output], list[Output]]:
    """``(reaching, others)``: the distinct roots whose value depends on one
    of the nodes ``culprits``, and the rest, each in root order."""
    bad = {id(n) for n in culprits}
    memo: dict[int, bool] = {}
    for node in _topo_order(roots):  # inputs come before their users
        memo[id(node)] = id(node) in bad or any(type(v) is Output and memo[id(v.node)] for v in node.inputs)
    reaching, others = [], []
    for r in dict.fromkeys(roots):
        (reaching if memo[id(r.node)] else others).append(r)
    return reaching, others
