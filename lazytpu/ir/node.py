"""Immutable IR values.

A ``Node`` is one recorded op: the op, its static arguments (``spec``: the
pytree structure of the call with tensor and lifted-scalar slots left open),
its input values and its output avals. Its structural signature ``sig`` is
computed once, when it is made; the fusion stage builds program keys from it.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from lazytpu import _caches


@attrs.frozen(slots=True)
class Aval:
    """Abstract value: what the compiler needs to know of an array."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


# Note [Failed checks spare the random state]: a random op's last output is
# the device's next PRNG key, of this one aval object (compared by identity).
# A key depends only on the key before it, never on the op's values: when a
# value check fails (``normal`` of a negative std, ``bernoulli`` of p = 2), the
# values computed from the op fail with its error, and the random state does
# not: the ops drawn after it still run (``split_roots(keys_pass=True)``).
RNG_AVAL = Aval((2,), torch.uint32)


@attrs.frozen(slots=True, eq=False)
class Data:
    """A materialized device buffer (opaque here). Identity is the buffer's."""

    buffer: Any
    aval: Aval


@attrs.frozen(slots=True, eq=False)
class Failed:
    """The value of a tensor whose program failed (Note [Deferred failures]).

    Note [Deferred failures]: when a fused program fails to compile or run,
    every tensor whose value depends on the failing op is re-bound to
    ``Failed`` (Note [Failure isolation] in lazytpu.fusion.program): using one raises
    the original error again, with the op and (when known) the source line;
    every other tensor is computed and bound as usual, and the next program
    runs normally.
    """

    error: BaseException
    aval: Aval


@attrs.frozen(slots=True)
class Scalar:
    """A Python number lifted to a program input (Note [Scalar lifting]).

    Note [Scalar lifting]: a float or int that cannot decide a shape is passed
    to the compiled program as an argument, so a changing learning rate, loss
    scale or step offset (``x + i`` in a loop) reuses the same program. Its
    kind (float/complex/int) is in the program key, its value is not, once
    it has been seen to change: until then it is compiled in as a constant
    (Note [Scalar specialization] in lazytpu.fusion.specialize). An int
    enters as a weak int64 and is cast to the op's dtype in the program,
    which wraps it as torch does (Note [Python integers wrap]); ints that
    pick an exact form (``x ** 2``, ``norm(p=2)``), ints past int64, bools
    and arguments that decide shapes (``arange``, ``full``) stay static.
    """

    value: float | complex | int

    @property
    def kind(self) -> type:
        return type(self.value)


def _depth(node) -> int:
    """A node's depth: one more than its deepest pending input's (a computed
    value's is 0).

    Note [Graph depth]: XLA's compile time grows with a program's depth, its
    longest chain of dependent ops, faster than linearly, and with its width
    about linearly: ``jax.jit`` of 1000 ops (``tanh(y @ W) * 0.5 + y * 0.5 +
    c``, 64x64) compiles in 15.4 s as one chain, 7.2 s as 2 chains of 500 and
    3.9 s as 4 of 250 (0.87 s for one of 250, 2.98 s for one of 500). The
    graph cap (``LAZYTPU_MAX_PENDING_DEPTH``, lazytpu.engine) bounds the depth
    of what is pending, so a loop that never syncs compiles programs of a
    bounded time, not one that takes minutes. Once it has cut, it cuts again
    at the same op (op and source line) as soon as the pending graph is past
    half the cap: a loop whose round is at most the cap deep is then cut
    after the same round each time, and every program after the first is a
    cache hit. At a fixed depth the cut fell at another op of the round each
    time (diffusers' UNet denoising loop compiled a program every 3.5 steps,
    to the end). Any other flush forgets where the cap cut.
    """
    deepest = 0
    for v in node.inputs:
        if type(v) is Output:
            d = v.node.depth
            if d > deepest:
                deepest = d
    return deepest + 1


@attrs.frozen(slots=True, eq=False)
class Node:
    """One recorded op. Equality is identity.

    ``static`` is the op's structure without its inputs (op, template, output
    avals): one interned ``OpSig`` shared by every node recorded from the
    same call signature (Note [Interned signatures]).
    """

    op: Any
    spec: Any  # lowering-stage call template (hashable)
    inputs: tuple[Any, ...]  # Output | Data | Scalar
    out_avals: tuple[Aval, ...]
    source: Any = None  # where the user recorded it: (code, lasti), see lazytpu.ir.source
    static: Any = None
    depth: int = attrs.field(init=False, default=attrs.Factory(_depth, takes_self=True))

    @property
    def sig(self):
        return self.static if self.static is not None else op_sig(self.op, self.spec, self.out_avals)


class OpSig:
    """A node's interned static structure (op, template, output avals).

    Note [Interned signatures]: equal structures are one object
    (``op_sig``), hashed and compared by identity. A program key is a tuple
    of these plus small int tuples, so hashing and comparing it at every sync
    costs a few C-level operations per op, where the structure itself would
    call Python-level ``__hash__``/``__eq__`` of ops, templates and avals.
    """

    __slots__ = ("static",)

    def __init__(self, static: tuple) -> None:
        self.static = static

    def __repr__(self) -> str:
        return f"OpSig{self.static!r}"


_SIGS = _caches.memo("op_signatures", limit=2 * _caches.MEMO_SIZE)
# Cleared with the program caches: a node recorded before the clear keeps its
# old OpSig, so a program mixing old and new ones gets a new key (a miss, never a wrong hit).
# The same holds for a forgotten signature (Note [Memo bound]); record plans hold
# theirs, and signatures are kept twice as long as plans.


def op_sig(op, spec, out_avals) -> OpSig:
    """The interned ``OpSig`` of this structure (Note [Interned signatures])."""
    static = (op, spec, out_avals)
    sig = _SIGS.get(static)
    if sig is None:
        sig = _SIGS.setdefault(static, OpSig(static))
    return sig


@attrs.frozen(slots=True)
class Output:
    """The ``index``-th result of a pending node."""

    node: Node
    index: int

    @property
    def aval(self) -> Aval:
        return self.node.out_avals[self.index]


Value = Output | Data | Scalar | Failed
