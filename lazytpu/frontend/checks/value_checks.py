"""torch's checks of values, by default, without a wait (issue: no silent wrong results).

Note [Value checks]: some of CPU torch's checks read data: an index out of
range (``x[i]``, gather/scatter, index_select/add/copy/fill, take/put,
embedding, ``searchsorted``'s ``sorter``), an ``nll_loss``/``cross_entropy`` target out of range, negative
or non-finite ``multinomial`` probabilities, ``bernoulli`` probabilities
outside [0, 1], a negative ``normal`` std or ``poisson`` rate, ``_segment_reduce`` lengths, a per-channel
fake quantization's integer zero points outside its range,
``repeat_interleave``'s repeats against its ``output_size``, an integer
division by zero, a non-finite matrix of a decomposition (Note [Non-finite matrices]),
``binary_cross_entropy``'s input outside [0, 1], ``histc``'s range taken from non-finite data. On
``tpu`` the data is not on the host when the op is recorded, and reading it
there would cut the program and make the host wait for the device at every
such op. Instead each checked op records, beside itself, a
``lazytpu.value_check`` node per checked tensor (lowering/checks.py): two
scalars computed inside the same program, the position of the first bad
element (or -1) and its value. They are read at the next host read
(``.cpu()``, ``.item()``, ``print``), once that read has waited for its own
program, and never waited for otherwise (a flush reads those already
computed; strict-blocking mode, which waits for each op, reads them at
the op). A bad element raises torch's own error: the op runs on CPU with
data-free stand-ins and an index (or probability) tensor that holds the bad
value alone, so that torch itself writes the message, and lazytpu adds the
op and the user's ``file:line``. The values that depend on the op fail
with that error (Note [Failure isolation]), also those later programs
computed from them (Note [Checks across programs] in lazytpu.engine_flush).
``LAZYTPU_DEBUG=bounds`` checks the index ops on the host instead
(lazytpu.frontend.checks.bounds), at the cost of a blocking read per op.

A rule below says, from an op's arguments (shapes and dims only), which
tensors to check, with which predicate and bounds; it runs once per call
signature (Note [Plans] in record), so the per-call cost is the check
nodes.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable

import attrs
import numpy as np
import torch

from lazytpu import _config
from lazytpu._registry import Registry
from lazytpu.frontend.checks.probe import run_on
from lazytpu.ir import Aval, Data, Node, Output, Storage
from lazytpu.ir.node import op_sig
from lazytpu.ir.template import Slot, Template
from lazytpu.lowering.checks import KEEP_IF_BAD, VALUE_CHECK

aten = torch.ops.aten

RULES = Registry("value checks")  # op -> fn(*args, **kwargs) -> [(tensor, kind, params, fill)]


def checks(*ops) -> Callable[[Callable], Callable]:
    """Register ``fn(*args, **kwargs) -> [(tensor, kind, params, fill)]`` as the
    value checks of ``ops``; ``fill`` is a value every element may hold."""
    return RULES.register(*ops)


@attrs.frozen(slots=True)
class Check:
    """One checked tensor of an op: ``values[leaf]`` of its call."""

    leaf: int
    kind: str
    params: tuple
    fill: float | int


# what a probe computes: [position of the first bad element or -1, its value's bits]
# (lowering/checks.py), one int64 pair so that a check is one program output
_PROBE_AVALS = (Aval((2,), torch.int64),)


class ValuePlan:
    """The value checks of one call signature, and how to replay the op on CPU."""

    __slots__ = ("func", "template", "stand_ins", "checks", "probes", "guard", "keeps_target")

    def __init__(self, func, template, stand_ins: list, checks: tuple[Check, ...], out_aval=None) -> None:
        self.func, self.template, self.stand_ins, self.checks = func, template, stand_ins, checks
        self.probes = []  # (check, the probe's template and interned signature), built once
        for check in checks:
            probe = Template((Slot(0),), (("kind", check.kind), ("params", check.params)))
            self.probes.append((check, probe, op_sig(VALUE_CHECK, probe, _PROBE_AVALS)))
        self.guard = None  # the template, avals and signature of its in-place calls' KEEP_IF_BAD node
        if func in KEPT_BY_SELECT and out_aval is not None:
            guard, avals = Template(tuple(Slot(i) for i in range(2 + len(checks))), ()), (out_aval,)
            self.guard = guard, avals, op_sig(KEEP_IF_BAD, guard, avals)
        # an in-place call's failed check fails nothing (Note [Failed writes change nothing])
        self.keeps_target = func in UNCHANGED_WHEN_BAD or self.guard is not None

    def record(
        self, ctx, node: Node | None, inputs: list, source=None, outputs: tuple = (), in_place: bool = False
    ) -> Output | None:
        """Record the check nodes of one call of the op ``node`` (Note [Value checks]).

        ``node=None``: the op's ``outputs`` (storages) are materialized already
        (a decomposed op in strict mode); ``source`` says where it was recorded.
        ``in_place``: the op's result is written into its ``self`` (Note
        [Failed writes change nothing]).

        Returns:
            The value to write into ``self`` in place of the op's first result
            when that is a ``KEEP_IF_BAD`` node's; else None.
        """
        if not _config.VALUE_CHECKS.value:
            return None
        lane = ctx.lane()
        graph = lane.graph
        if node is not None:
            source = node.source
        harmless = in_place and self.keeps_target
        probes = []
        for check, template, sig in self.probes:
            probe = Node(VALUE_CHECK, template, (inputs[check.leaf],), _PROBE_AVALS, source, sig)
            probes.append(Output(probe, 0))
            result = Storage(probes[-1], graph, (1,))
            pending = PendingValueCheck(self, check, node if node is not None else probe, result)
            pending.harmless = harmless
            if node is None:  # fail them with the probe's own result (Note [Failure isolation])
                pending.extra = [
                    (weakref.ref(s), result.value, weakref.ref(s.value.buffer))
                    for s in outputs
                    if type(s.value) is Data
                ]
            lane.value_checks.append(pending)  # not counted as a recorded op: the op it checks is
        if not in_place or self.guard is None:
            return None
        template, avals, sig = self.guard
        return Output(Node(KEEP_IF_BAD, template, (Output(node, 0), inputs[0], *probes), avals, source, sig), 0)

    def value(self, check: Check, bits: int):
        """The checked element's value from the probe's bits."""
        dtype = self.stand_ins[check.leaf][1]
        if dtype.is_floating_point or dtype.is_complex:  # a complex element's real part
            return float(np.int64(bits).view(np.float64))
        return bool(bits) if dtype is torch.bool else int(bits)

    def error(self, check: Check, position: int, value) -> BaseException:
        """torch's error for ``value`` at flat ``position`` of the checked tensor."""
        shape, dtype = self.stand_ins[check.leaf]
        bad = _REPLAYS.get(check.kind, _one_bad)(shape, dtype, check, position, value)
        leaves = [
            bad if i == check.leaf else (_zeros(*s) if type(s) is tuple else s) for i, s in enumerate(self.stand_ins)
        ]
        try:
            run_on(_REPLAYED_AS.get(self.func, self.func), self.template, leaves, "cpu", stand_in=_as_it_is)
        except Exception as exc:  # noqa: BLE001 - torch's own error is what we want
            return exc
        return RuntimeError(f"{self.func}: value {value} at position {position} is not valid")


def _zeros(shape, dtype) -> torch.Tensor:
    """Zeros standing in for a tensor of the replayed call: expanded from one
    element when large (a weight), real when small (some CPU kernels read an
    index or offsets tensor as if it were contiguous)."""
    zeros = torch.zeros((), dtype=dtype).expand(shape)
    return zeros.contiguous() if zeros.numel() <= 1 << 16 else zeros


def _as_it_is(leaf):
    return leaf


def _one_bad(shape, dtype, check: Check, position: int, value) -> torch.Tensor:
    bad = torch.full(shape, check.fill, dtype=dtype)
    bad.view(-1)[position] = value
    return bad


def _bad_row(shape, dtype, check: Check, position: int, value) -> torch.Tensor:
    bad = torch.full(shape, check.fill, dtype=dtype)
    rows = bad.view(-1, shape[-1] if shape else 1)
    rows[position // rows.shape[1]] = 0  # the whole row sums to <= 0
    return bad


def _too_many(shape, dtype, check: Check, position: int, value) -> torch.Tensor:
    bad = torch.zeros(check.params[1], dtype=dtype)  # the mask as broadcast, True up to the first one too many
    bad.view(-1)[: position + 1] = True
    return bad


def _bad_offset(shape, dtype, check: Check, position: int, value) -> torch.Tensor:
    bad = torch.zeros(shape, dtype=dtype)
    bad[position:] = value
    if position >= 2:  # after a larger one (at 0 or 1, the first offset or the input's length decides)
        bad[1:position] = value + 1
    return bad


def _non_finite(shape, dtype, check: Check, position: int, value) -> torch.Tensor:
    """The element's value where it is a non-finite float, else a NaN (a complex element's imaginary part)."""
    bad = value if isinstance(value, float) and not math.isfinite(value) else float("nan")
    return _one_bad(shape, dtype, check, position, bad)


def _bad_lengths(shape, dtype, check: Check, position: int, value) -> torch.Tensor:
    """Zeros (rows that sum to 0, not to the data's size), or the negative length, or a row summing to 1."""
    return _one_bad(shape, dtype, check, position, value if value < 0 else int(check.params[0] == 0))


def _bad_repeats(shape, dtype, check: Check, position: int, value) -> torch.Tensor:
    """Repeats summing to other than ``output_size``, or a negative one among
    repeats that sum to it (the first marks a sum, the second a negative repeat),
    put last: CPU's kernel writes out of bounds when a negative repeat comes
    before another one it accepts."""
    total = check.params[0]
    bad = torch.zeros(shape, dtype=dtype)
    if value >= 0 or shape[0] == 1:
        bad[0] = int(total == 0)
    else:
        bad[0], bad[-1] = total - value, value
    return bad


def _nan(shape, dtype, check: Check, position: int, value) -> torch.Tensor:
    return _one_bad(shape, dtype, check, position, float("nan"))


# kind -> the checked tensor of a CPU call that fails as the device's values did
_REPLAYS = {
    "row_sums": _bad_row,
    "count_above": _too_many,
    "offsets": _bad_offset,
    "finite": _non_finite,
    "svd_finite": _nan,
    "lengths": _bad_lengths,
    "repeats": _bad_repeats,
}


@attrs.define(slots=True)
class PendingValueCheck:
    """A value check in flight: recorded, then computed by a flush, then read.

    ``roots`` and ``settled`` are the flush's (set by the engine): which
    values to fail with the check's error."""

    plan: ValuePlan
    check: Check
    node: Node
    result: Storage
    roots: list | None = None
    settled: list | None = None
    extra: list | tuple = ()
    reached: dict | None = None  # Note [Checks across programs] in lazytpu.engine_flush
    harmless: bool = False  # its op wrote nothing when it failed (Note [Failed writes change nothing])


# Note [Failed writes change nothing]: an in-place index write whose index
# is out of range (``x[bad] = v``, ``index_copy_``, ``scatter_``, ``put_``,
# ``index_add_``, ``masked_scatter_`` with too few source elements) raises
# on CPU before or part-way through its writes, and the target keeps its
# data. On ``tpu`` the error is raised later (Note [Value checks]), after the
# op's program ran, so the lowerings of these ops write nothing when any
# index lies outside the range their check allows (``write_positions`` in
# lazytpu.lowering.indexing sends every index out of bounds, where the scatter
# drops it): their result is their ``self``, unchanged. An in-place call of
# one (``harmless``) then fails no value when its check fails: the target,
# and everything computed from it since, read as if the op had not run (CPU
# wrote the elements before the bad one; lazytpu writes none). A functional
# call (``y = x.index_put(...)``) still fails its result, a tensor that CPU
# never made. The elementwise checked ops (an integer division by a zero
# element, a ``masked_fill`` value that does not fit, ``bernoulli_``
# probabilities outside [0, 1]) keep their target alike: an in-place call
# writes a ``KEEP_IF_BAD`` node after the op, which selects the target's
# old value when a probe found a bad element (one select, fused with the
# op's own elementwise loop; a scatter's would be a pass over its whole
# target, which the KV cache's ``index_copy_`` of each generated token
# cannot afford).
_WRITES_ALONG = (  # writes at indices along one dim, each in [0, size)
    aten.scatter.src,
    aten.scatter.value,
    aten.scatter.reduce,
    aten.scatter.value_reduce,
    aten.scatter_add.default,
    aten.scatter_reduce.two,
    aten.index_add.default,
    aten.index_copy.default,
    aten.index_reduce.default,
)
UNCHANGED_WHEN_BAD = frozenset(
    {
        *_WRITES_ALONG,
        aten.index_put.default,
        aten._unsafe_index_put.default,
        aten.put.default,
        aten.index_fill.int_Tensor,
        aten.index_fill.int_Scalar,
        aten.masked_scatter.default,
    }
)

KEPT_BY_SELECT = frozenset(
    {
        aten.div.Tensor_mode,
        aten.remainder.Tensor,
        aten.fmod.Tensor,
        aten.floor_divide.default,
        aten.masked_fill.Tensor,
        aten.bernoulli.Tensor,
    }
)


def plan(func, args, kwargs, template, values: list, out_aval=None) -> ValuePlan | None:
    """The value checks of a call signature, or None (most ops)."""
    rule = RULES.get(func)
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
    return ValuePlan(func, template, stand_ins, tuple(found), out_aval)


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


@checks(aten.gather.default, aten.index_select.default, *_WRITES_ALONG)
def _index_along(self, dim, index, *rest, **kwargs):
    return _index_range(self, dim, index)


@checks(aten.index_fill.int_Tensor, aten.index_fill.int_Scalar)
def _index_fill(self, dim, index, value):
    """index_fill, alone of these ops, takes negative indices."""
    size = _size(self, dim)
    return [(index, "range", (-size, size), 0)] if _integral(index) else []


@checks(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def _searchsorted(sorted_sequence, values, *, sorter=None, **kwargs):
    """Every ``sorter`` index in range, also those the search never visits (as CPU)."""
    return _index_range(sorted_sequence, -1, sorter) if sorter is not None else []


@checks(aten.embedding.default)
def _embedding(weight, indices, *rest, **kwargs):
    return _index_range(weight, 0, indices)


@checks(aten._embedding_bag.default, aten._embedding_bag_forward_only.default)
def _embedding_bag(weight, indices, offsets, *rest, **kwargs):
    """Indices in range, and the offsets of a 1-D input: the first 0, none
    decreasing, none past the input's end."""
    found = _index_range(weight, 0, indices)
    if indices.dim() == 1 and _integral(offsets) and offsets.dim() == 1:
        found.append((offsets, "offsets", (indices.numel(),), 0))
    return found


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


@checks(aten.masked_scatter.default)
def _masked_scatter(self, mask, source):
    """No more True elements in the mask (as broadcast to ``self``) than ``source`` has elements."""
    if mask.dtype is not torch.bool:
        return []
    return [(mask, "count_above", (source.numel(), tuple(torch.broadcast_shapes(self.shape, mask.shape))), False)]


@checks(aten.multinomial.default)
def _multinomial(self, *rest, **kwargs):
    return [(self, "probability", (), 1), (self, "row_sums", (), 1)]


@checks(aten.binary_cross_entropy.default)
def _binary_cross_entropy(self, *rest, **kwargs):
    return [(self, "unit_interval", (), 0.5)]


@checks(aten.histc.default)
def _histc(self, bins=100, min=0, max=0):  # noqa: A002 - torch's argument names
    """With ``min == max`` the range is the data's: CPU refuses a non-finite one."""
    return [(self, "finite", (), 0)] if min == max else []


@checks(aten.bernoulli.default)
def _bernoulli(self, **kwargs):
    return [(self, "unit_interval", (), 0.5)]


@checks(aten.bernoulli.Tensor)
def _bernoulli_tensor(self, p, **kwargs):
    return [(p, "unit_interval", (), 0.5)] if isinstance(p, torch.Tensor) else []


@checks(aten.normal.Tensor_Tensor, aten.normal.float_Tensor)
def _normal(mean, std, **kwargs):
    return [(std, "non_negative", (), 1)] if isinstance(std, torch.Tensor) else []


@checks(aten.poisson.default)
def _poisson(self, generator=None):
    return [(self, "non_negative", (), 1)]


@checks(aten.segment_reduce.default)
def _segment_lengths(data, reduce, *, lengths=None, axis=0, unsafe=False, **kwargs):
    """Without ``unsafe``, no negative length and each row of lengths sums to the data's size along ``axis``."""
    if unsafe or lengths is None or not _integral(lengths):
        return []
    return [(lengths, "lengths", (_size(data, axis),), 0)]


@checks(aten.fake_quantize_per_channel_affine_cachemask.default)
def _zero_points(x, scale, zero_point, axis, quant_min, quant_max):
    """An integer zero point inside ``[quant_min, quant_max]`` (CPU reads them: a floating one is not checked)."""
    if not _integral(zero_point):
        return []
    return [(zero_point, "fits", (quant_min, quant_max), quant_min)]


@checks(aten.repeat_interleave.Tensor)
def _repeats(repeats, *, output_size=None):
    """With an ``output_size`` (else the op is data-dependent): repeats summing
    to it, none negative."""
    if output_size is None or not _integral(repeats) or repeats.dim() != 1:
        return []
    return [(repeats, "repeats", (output_size,), 0)]


# Note [Non-finite matrices]: CPU's LAPACK kernels refuse a matrix holding a
# NaN (``svd`` and what calls it: ``svdvals``, ``pinv``, ``matrix_rank``,
# ``matrix_norm(ord=2)``, ``cond``) or any non-finite element (``eig``,
# ``eigvals``; ``eigh`` in the triangle it reads) with a ``LinAlgError``;
# XLA's decompositions return NaNs instead, and ``matrix_rank`` of such a
# matrix read 0. The error is CPU's, raised at the next read as every value
# check's. One departure: CPU's ``svd`` of a matrix with an infinity but no
# NaN returns what LAPACK computed after printing a parameter error, and
# XLA:CPU's SVD never returns for it (``lowering.linalg_spectral._svd``); it
# raises the error of a NaN (``svd_finite``). CPU's ``eigvals`` of a
# non-finite matrix crashes the process; its replay is ``eig``'s, whose check
# is the same. The replay's matrix is zeros but for the bad element: an
# ``eigh`` error code (LAPACK's, which depends on all the values) may differ
# from CPU's on the real matrix, and ``eigvalsh``'s is ``eigh``'s (torch's
# ``eigvalsh`` of a tensor subclass computes the vectors too).
@checks(aten._linalg_svd.default)
def _svd(a, *args, **kwargs):
    return [(a, "svd_finite", (), 0)]


@checks(aten._linalg_eigh.default)
def _eigh(a, UPLO="L", compute_v=True):  # noqa: N803 - torch's argument name
    return [(a, "finite", (UPLO.upper(),), 0)]


@checks(aten.linalg_eig.default, aten.linalg_eigvals.default, aten._linalg_eigvals.default)
def _eig(a):
    return [(a, "finite", (), 0)]


@checks(aten.linalg_pinv.atol_rtol_tensor)
def _pinv(a, *, atol=None, rtol=None, hermitian=False):
    return [(a, "finite", ("L",), 0)] if hermitian else [(a, "svd_finite", (), 0)]


_REPLAYED_AS = {
    aten.linalg_eigvals.default: aten.linalg_eig.default,
    aten._linalg_eigvals.default: aten.linalg_eig.default,
}


@checks(aten.div.Tensor_mode, aten.remainder.Tensor, aten.fmod.Tensor, aten.floor_divide.default)
def _integer_division(self, other, **kwargs):
    if kwargs.get("rounding_mode", "floor") is None or not (_integral(self) and _integral(other)):
        return []
    return [(other, "nonzero", (), 1)]


# the ops lazytpu.frontend.checks.bounds checks on the host instead when LAZYTPU_DEBUG has "bounds"
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
