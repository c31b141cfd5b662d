"""The in-program value checks (Note [Value checks] in lazytpu.frontend.checks.value_checks).

``lazytpu.value_check`` computes, for one tensor an op reads, the flat
position of its first bad element (``-1`` when every element is fine) and
that element's value (its bits, for a float): one int64 pair, read by the
host at the next host read.
What "bad" means is a predicate per kind, a pure function of the tensor and
static bounds.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from lazytpu.lowering.registry import lowering

VALUE_CHECK = "lazytpu.value_check"
KEEP_IF_BAD = "lazytpu.keep_if_bad"


def _out_of_range(x, lo, hi, ignore=None):
    bad = (x < lo) | (x >= hi)
    return bad if ignore is None else bad & (x != ignore)


def _does_not_fit(x, lo, hi):
    return ~((x >= lo) & (x <= hi))  # NaN does not fit


def _count_above(x, n, shape):
    counts = jnp.cumsum(jnp.broadcast_to(x, shape).reshape(-1).astype(jnp.int64))
    return (counts > n).reshape(shape)


def _bad_offsets(x, n):
    """embedding_bag's offsets: the first 0, none decreasing, none past ``n``."""
    first = jnp.arange(x.shape[0]) == 0
    previous = jnp.concatenate([x[:1], x[:-1]])
    return (first & (x != 0)) | (x > n) | (x < previous)


def _not_a_probability(x):
    return ~(x >= 0) | jnp.isinf(x)  # NaN fails x >= 0


def _row_sum_not_positive(x):
    rows = x.reshape(-1, x.shape[-1]) if x.ndim else x.reshape(1, 1)
    return jnp.broadcast_to(~(rows.sum(-1, keepdims=True) > 0), rows.shape)


def _outside_unit_interval(x):
    return ~((x >= 0) & (x <= 1))


def _negative(x):
    return ~(x >= 0)


def _zero(x):
    return x == 0


def _bad_lengths(x, n):
    """A negative length, else each length of a row not summing to ``n`` (CPU's order of checks)."""
    negative = x < 0
    return jnp.where(jnp.any(negative), negative, jnp.broadcast_to(x.sum(-1, keepdims=True) != n, x.shape))


def _bad_repeats(x, n):
    """CPU's order: the sum against ``n`` (marked at the first repeat that is not
    negative, else the first), then each negative repeat."""
    negative = x < 0
    first = jnp.arange(x.shape[0]) == jnp.argmax(~negative)
    return jnp.where(x.sum() != n, first, negative)


def _in_triangle(bad, triangle):
    """``bad`` where a matrix kernel reads (``"L"``/``"U"``: one triangle of each matrix, as ``eigh``)."""
    if triangle == "L":
        return jnp.tril(bad)
    return jnp.triu(bad) if triangle == "U" else bad


def _not_finite(x, triangle=None):
    return _in_triangle(~jnp.isfinite(x), triangle)


# kind -> predicate(x, *params): a boolean mask of the elements torch refuses
PREDICATES = {
    "range": _out_of_range,
    "fits": _does_not_fit,
    "count_above": _count_above,
    "offsets": _bad_offsets,
    "probability": _not_a_probability,
    "row_sums": _row_sum_not_positive,
    "unit_interval": _outside_unit_interval,
    "non_negative": _negative,
    "nonzero": _zero,
    "finite": _not_finite,
    "lengths": _bad_lengths,
    "repeats": _bad_repeats,
    "svd_finite": _not_finite,
}


@lowering(VALUE_CHECK)
def value_check(x, *, kind, params):
    bad = PREDICATES[kind](x, *params).reshape(-1)  # of x's shape, or of the shape x broadcasts to
    if bad.shape[0] == 0:
        return jnp.array([-1, 0], jnp.int64)
    pos = jnp.argmax(bad)
    value = x.reshape(-1)[pos] if bad.shape[0] == x.size else jnp.zeros((), x.dtype)
    if jnp.iscomplexobj(value):  # a non-finite matrix element: its real part (else its replay puts a NaN there)
        value = value.real
    if jnp.issubdtype(value.dtype, jnp.floating):  # its bits, to share one int64 output with the position
        bits = lax.bitcast_convert_type(value.astype(jnp.float64), jnp.int64)
    else:
        bits = value.astype(jnp.int64)
    return jnp.stack([jnp.where(bad[pos], pos, -1).astype(jnp.int64), bits])


@lowering(KEEP_IF_BAD)
def keep_if_bad(result, target, *probes):
    """``result``, or ``target`` unchanged when a probe found a bad element (Note
    [Failed writes change nothing] in lazytpu.frontend.checks.value_checks)."""
    ok = jnp.all(jnp.stack([probe[0] < 0 for probe in probes]))
    return jnp.where(ok, result, target)
