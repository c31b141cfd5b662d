"""A program's Python numbers as constants until they change (Note [Scalar specialization])."""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any

import attrs

from lazytpu import _caches

# Note [Scalar specialization]: a lifted Python number (Note [Scalar lifting]
# in lazytpu.ir.node) is compiled into its program as a constant the first
# time a program of its structure (the program key without the numbers'
# values) runs, and becomes a runtime input (Note [Packed scalars] in
# lazytpu.lowering.to_jax) only once a later program of the same structure
# has another value at its position. XLA compiles a program whose numbers it
# knows about twice as fast as one that takes them as parameters (the
# 250-op chain of ``benchmarks.compile_time``: 4.0 s against 8.0 s in
# ``jax.jit`` alone), so a number that never changes (the chain's ``0.5``, a
# fixed learning rate, an ``eps``) stays a constant, and one that does (a
# learning-rate schedule, AdamW's bias corrections, a loop's offset) costs
# one more compile, after which every value reuses the program, as dynamo
# does for ints. Positions are lifted for good: a structure compiles at most
# once more than it has positions that ever change.
#
# The state of a structure is an ``_Entry`` of a bounded table (Note [Memo
# bound] in lazytpu._caches): the values seen first, the positions lifted,
# and the program key, which ends in a serial number given to each new state
# and never reused, so a program compiled for some constants is never found
# for others. Numbers are the same only if they are the same number: ``0.0``
# and ``-0.0`` differ, and a NaN never equals another, so it is lifted at its
# second sight. A forgotten entry specializes again from the next values
# seen: one more compile, never a wrong program.


@attrs.frozen(slots=True)
class Constant:
    """The input kind of a lifted number compiled in as a constant (Note [Scalar specialization])."""

    kind: type  # float, int or complex, as the lifted number's
    value: Any


class ProgramKey(tuple):
    """A program key whose hash is computed once: the program cache finds it
    by that hash and by identity, not by hashing and comparing its ops."""

    def __new__(cls, parts: tuple) -> ProgramKey:
        self = super().__new__(cls, parts)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash


_SERIALS = itertools.count()


class _Entry:
    """One structure's specialization: its numbers' first values, which are
    lifted, the program key and input kinds that follow."""

    __slots__ = ("values", "lifted", "pick", "stable", "zeros", "key", "kinds")

    def __init__(self, structure: tuple, kinds: tuple, positions: list, values: list, lifted: frozenset) -> None:
        self.values, self.lifted = values, lifted
        kept = [j for j in range(len(values)) if j not in lifted]
        self.pick = operator.itemgetter(*kept) if kept else None
        self.stable = self.pick(values) if kept else None
        # the kept numbers whose equality does not say they are the same number
        self.zeros = [j for j in kept if (type(values[j]) is float and not values[j]) or type(values[j]) is complex]
        self.key = ProgramKey((*structure, next(_SERIALS)))
        kinds = list(kinds)
        for j in kept:
            kinds[positions[j]] = Constant(kinds[positions[j]], values[j])
        self.kinds = tuple(kinds)


_ENTRIES = _caches.memo("scalar_specializations", limit=1024)


def _same(a, b) -> bool:
    """Whether two numbers of one kind are the same number (``0.0`` is not ``-0.0``)."""
    if a != b:
        return False
    if type(a) is complex:
        return _same(a.real, b.real) and _same(a.imag, b.imag)
    return type(a) is not float or a or math.copysign(1.0, a) == math.copysign(1.0, b)


def specialize(structure: tuple, kinds: tuple, positions: list, values: list) -> tuple[tuple, tuple]:
    """The program key and input kinds of a program of key ``structure`` and
    input ``kinds``, whose lifted numbers, at input ``positions``, have
    ``values`` (Note [Scalar specialization])."""
    entry = _ENTRIES.get(structure)
    if entry is not None:
        pick = entry.pick
        if pick is None:
            return entry.key, entry.kinds
        old = entry.values
        if pick(values) == entry.stable and all(_same(values[j], old[j]) for j in entry.zeros):
            return entry.key, entry.kinds
        changed = {j for j in range(len(values)) if j not in entry.lifted and not _same(values[j], old[j])}
        if not changed:
            return entry.key, entry.kinds
        lifted = entry.lifted | changed
    else:
        lifted = frozenset()
    entry = _ENTRIES[structure] = _Entry(structure, kinds, positions, values, lifted)
    return entry.key, entry.kinds
