"""Build a canonical ``Program`` from the roots a sync must materialize."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from lazytpu.fusion.specialize import specialize
from lazytpu.ir.node import RNG_AVAL, Aval, Data, Failed, Node, Output, Scalar
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

    __slots__ = ("key", "input_kinds", "_codes", "_nodes", "_parts", "_ops")

    def __init__(self, key: tuple, nodes: list, parts: tuple, input_kinds: tuple, outputs: tuple) -> None:
        self.key = key
        # Aval for buffers, float/int/complex for lifted numbers, Constant for those compiled in
        # (Note [Scalar specialization] in lazytpu.fusion.specialize)
        self.input_kinds = input_kinds
        self._codes = outputs  # Note [Flat program keys]: decoded by ``outputs``, when needed
        self._nodes, self._parts, self._ops = nodes, parts, None

    @property
    def outputs(self) -> tuple[Ref, ...]:
        """The outputs' refs, in order."""
        return tuple(_decode(code) for code in self._codes)

    @property
    def ops(self) -> tuple[ProgramOp, ...]:
        if self._ops is None:
            ops, at, parts = [], 0, self._parts
            for n in self._nodes:  # each node's sig, then one code per input (Note [Flat program keys])
                refs = tuple(_decode(code) for code in parts[at + 1 : at + 1 + len(n.inputs)])
                at += 1 + len(n.inputs)
                ops.append(ProgramOp(n.op, n.spec, refs, n.out_avals, source_text(n.source)))
            self._ops = tuple(ops)
            self._nodes = self._parts = None  # the nodes hold input buffers: do not keep them
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
    return list(_walk(roots))


def _walk(roots: list[Output]) -> Iterator[Node]:
    """The nodes ``roots`` depend on, each once, every node after its inputs."""
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(r.node, False) for r in reversed(roots)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            yield node
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for v in reversed(node.inputs):
            if type(v) is Output and id(v.node) not in seen:
                stack.append((v.node, False))


_OUT_SHIFT = 32  # Note [Flat program keys]
_OUT_MASK = (1 << _OUT_SHIFT) - 1


def build_program(roots: list[Output], specialize_numbers: bool = True) -> tuple[Program, list, list[Output]]:
    """Collect everything ``roots`` depend on. ``specialize_numbers=False``
    keeps every lifted number a runtime input (Note [Numbers of multi-process
    programs]).

    Note [Flat program keys]: a program's key lists each op's interned
    ``OpSig`` followed by one int per input: ``j << 32 | k`` for the ``k``-th
    output of the ``j``-th op, ``~i`` for the ``i``-th program input. Signatures
    and ints alternate unambiguously, and no tuple is made per op or input:
    the four keys of a Llama step hash and compare (the specialization table's
    lookup, every sync) in 56 us against 92 us as tuples of tuples. The ops
    are in ``_topo_order``'s order, each encoded as the walk reaches it (its
    inputs have their positions by then); ``Program.ops`` decodes the refs
    only when needed (a compile, an error).

    Returns:
        The program, the runtime values of its inputs (device buffers and
        Python scalars, in input order), and the distinct roots in output
        order.
    """
    nodes: list[Node] = []
    position: dict[int, int] = {}
    inputs: list = []
    kinds: list = []
    buffer_slot: dict[int, int] = {}
    parts: list = []
    scalar_at: list[int] = []
    scalar_values: list = []
    for node in _walk(roots):  # each node's inputs have their positions by now
        parts.append(node.sig)
        for v in node.inputs:
            kind = type(v)
            if kind is Output:
                parts.append(position[id(v.node)] << _OUT_SHIFT | v.index)
            elif kind is Data:
                slot = buffer_slot.get(id(v.buffer))
                if slot is None:
                    slot = buffer_slot[id(v.buffer)] = len(inputs)
                    inputs.append(v.buffer)
                    kinds.append(v.aval)
                parts.append(~slot)
            elif kind is Scalar:
                scalar_at.append(len(inputs))
                scalar_values.append(v.value)
                parts.append(~len(inputs))
                inputs.append(v.value)
                kinds.append(v.kind)
            elif kind is Failed:
                raise FailedInput(node, v.error)
            else:
                raise TypeError(f"bad IR input {v!r}")
        position[id(node)] = len(nodes)
        nodes.append(node)
    distinct = list(dict.fromkeys(roots))
    outputs = tuple(position[id(r.node)] << _OUT_SHIFT | r.index for r in distinct)
    parts = tuple(parts)
    kinds = tuple(kinds)
    key = (parts, kinds, outputs)
    if scalar_at and specialize_numbers:
        key, kinds = specialize(key, kinds, scalar_at, scalar_values)
    return Program(key, nodes, parts, kinds, outputs), inputs, distinct


def _decode(code: int) -> Ref:
    """A ref of Note [Flat program keys] as ``ProgramOp.inputs`` holds it."""
    return ("in", ~code) if code < 0 else (code >> _OUT_SHIFT, code & _OUT_MASK)


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


def split_roots(
    roots: list[Output], culprits, buffers: dict | None = None, keys_pass: bool = False
) -> tuple[list[Output], list[Output]]:
    """``(reaching, others)``: the distinct roots whose value depends on one
    of the nodes ``culprits`` (or reads one of ``buffers``: ``{id(buffer):
    weakref to it}``), and the rest, each in root order. With ``keys_pass``
    (the culprits computed, but values that fail a check), a random op's
    next key carries nothing: it does not depend on the op's values (Note
    [Failed checks spare the random state])."""
    bad = {id(n) for n in culprits}
    memo: dict[int, bool] = {}
    for node in _topo_order(roots):  # inputs come before their users
        memo[id(node)] = id(node) in bad or any(
            (type(v) is Output and memo[id(v.node)] and not (keys_pass and v.aval is RNG_AVAL))
            or (buffers and type(v) is Data and _held(buffers, v.buffer))
            for v in node.inputs
        )
    reaching, others = [], []
    for r in dict.fromkeys(roots):
        (reaching if memo[id(r.node)] and not (keys_pass and r.aval is RNG_AVAL) else others).append(r)
    return reaching, others


def _held(buffers: dict, buffer) -> bool:
    ref = buffers.get(id(buffer))
    return ref is not None and ref() is buffer
