"""Advanced indexing as CPU torch (Note [Advanced indexing]): masks (bool and
uint8), several masks, masks beside slices, ``None``, ``...`` and index
tensors, and torch's checks of index dtypes and shapes, raised at the call
with CPU torch's type and message, in both modes."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import MODES, assert_close, mode, to_cpu

import lazytpu


def _t(*shape, dtype=torch.float32):
    return torch.arange(float(torch.Size(shape).numel())).reshape(shape).to(dtype)


def _bools(*values):
    return torch.tensor(values, dtype=torch.bool)


def _bytes(*values):
    return torch.tensor(values, dtype=torch.uint8)


def _set(x, index, value):
    x[index] = value
    return x


def _index(index):
    """A function of a device: its index (a tensor, or a tuple of entries) on it."""
    if isinstance(index, tuple):
        return lambda d: tuple(_index(i)(d) for i in index)
    return lambda d: index.to(d) if isinstance(index, torch.Tensor) else index


def _get(shape, index):
    return lambda d: _t(*shape).to(d)[_index(index)(d)]


def _put(shape, index, value):
    return lambda d: _set(_t(*shape).to(d), _index(index)(d), value.to(d) if isinstance(value, torch.Tensor) else value)


def _true_is_a_copy(shape):
    def run(d):
        a = _t(*shape).to(d)
        b = a[True]
        b += 1
        return a, b

    return run


def _acc(shape, mask, values):
    return lambda d: _t(*shape).to(d).index_put_((mask.to(d),), values.to(d), accumulate=True)


def _split_copy_out(d):
    out = (torch.empty(2, 2).to(d), torch.empty(2, 2).to(d))
    returned = torch.split_copy(_t(4, 2).to(d), 2, out=out)
    return returned is None, out


def _ctc_no_targets(targets, lengths):
    def run(d):
        log_probs = torch.linspace(-3, 0, 40).reshape(5, 2, 4).log_softmax(2).to(d)
        return F.ctc_loss(log_probs, targets.to(d), lengths, [0, 0], reduction="none")

    return run


def _mask_count(d):
    b = torch.arange(4).to(d)
    b[b > 1] = torch.tensor([1, 2, 3]).to(d)
    return b


def _pending_mask_count(d):
    x = _t(3, 4).to(d)
    x[x[:, 0] > 3] = torch.ones(3, 4).to(d)
    return x


# Item 4 of issue 19: each case is a function of a device name.
MASKS = {
    "byte_mask_sets_rows": _put((4, 4), _bytes(1, 0, 1, 0), torch.arange(4.0)),
    "byte_mask_sets_a_block": _put((4, 4), _bytes(1, 0, 1, 0), torch.ones(2, 4)),
    "byte_mask_fills_no_scalar": _put((4, 4), _bytes(1, 0, 1, 0), 1.0),
    "byte_mask_gets_rows": _get((4, 3), _bytes(1, 0, 1, 0)),
    "byte_masks_twice": _get((5, 7, 3), (_bytes(1, 0, 1, 1, 0), slice(None), _bytes(1, 1, 1))),
    "byte_mask_accumulates_nothing": lambda d: (
        torch.ones(10, 10)
        .to(d)
        .index_put_(
            (torch.zeros(10, dtype=torch.uint8).to(d),),
            torch.ones(10, 10).to(d)[torch.zeros(10, dtype=torch.uint8)],
            True,
        )
    ),
    "two_masks": _get((3, 4, 3), (_bools(1, 0, 1), slice(None), _bools(1, 0, 1))),
    "two_masks_do_not_broadcast": _get((3, 4, 5), (_bools(1, 0, 1), slice(None), _bools(1, 0, 1, 1, 0))),
    "two_masks_set": _put((3, 4, 3), (_bools(1, 0, 1), slice(1, None), _bools(1, 0, 1)), torch.tensor([[-1.0], [-2]])),
    "two_masks_set_do_not_broadcast": _put((3, 4, 5), (_bools(1, 0, 1), slice(None), _bools(1, 0, 1, 1, 0)), 1.0),
    "mask_beside_an_index": _get((3, 4, 5), (_bools(1, 0, 1), slice(None), torch.tensor([1, 4]))),
    "mask_beside_an_index_set": _put(
        (3, 4, 5), (_bools(1, 0, 1), slice(None), torch.tensor([1, 4])), torch.tensor([[-1.0], [-2]])
    ),
    "mask_after_a_slice_and_none": _get((3, 4, 5), (slice(1, None), _bools(1, 0, 1, 1), None, ...)),
    "mask_after_ellipsis": _get((3, 4, 5), (..., _bools(1, 0, 1, 1, 0))),
    "mask_between_nones": _get((3, 4), (None, _bools(1, 0, 1), None)),
    "mask_2d_then_a_slice": _put((3, 4, 5), (_t(3, 4) > 5, slice(1, None)), torch.tensor([-1.0, -2, -3, -4])),
    "mask_after_ellipsis_set": _put((3, 4), (..., _bools(1, 0, 1, 0)), torch.tensor([[-1.0], [-2], [-3]])),
    "mask_between_nones_set": _put((3, 4), (None, _bools(1, 0, 1), None), torch.arange(4.0)),
    "all_false_mask_accumulates_rows": _acc((3, 4), _bools(0, 0, 0), torch.ones(0, 4)),
    "all_false_mask_accumulates_a_scalar": _acc((3, 4), _bools(0, 0, 0), torch.tensor(1.0)),
    "empty_mask_set": _put((0, 1, 3), torch.zeros(0, 1, 3, dtype=torch.bool), 1.0),
    "empty_mask_set_rows": _put((2, 0), torch.zeros(2, 0, dtype=torch.bool), torch.ones(1)),
    "empty_mask_set_bad_values": _put((0,), torch.zeros(0, dtype=torch.bool), torch.ones(3)),
    "true_is_a_copy": _true_is_a_copy((2, 3)),
    "true_of_a_scalar_is_a_copy": _true_is_a_copy(()),
    "true_set_with_prefix_ones": _put((2, 3), True, -torch.ones(1, 1, 2, 3)),
    "true_set_with_a_bad_prefix": _put((2, 3), torch.tensor(True), torch.ones(5, 1, 2, 3)),
    "bool_view_as_uint8": lambda d: _bools(1, 0, 1).to(d).view(torch.uint8),
    "bool_view_as_int8": lambda d: _bools(1, 0).to(d).view(torch.int8),
    "uint8_view_as_bool": lambda d: _bytes(1, 0, 1).to(d).view(torch.bool),
    "bool_view_as_complex": lambda d: _bools(1, 0, 1, 1, 0, 0, 1, 0).reshape(1, 8).to(d).view(torch.complex64),
    "float_view_as_bool": lambda d: torch.tensor([[1.0, 0.0]]).to(d).view(torch.bool),
    "split_copy_out": _split_copy_out,
    "nonzero_out": lambda d: torch.nonzero(_t(2, 3).to(d) % 2, out=torch.empty(0, dtype=torch.long).to(d)),
    "nonzero_out_resized": lambda d: torch.nonzero(_t(2, 3).to(d) % 2, out=torch.empty((), dtype=torch.long).to(d)),
    "ctc_loss_no_targets": _ctc_no_targets(torch.zeros(0, dtype=torch.long), [5, 5]),
    "ctc_loss_no_targets_2d": _ctc_no_targets(torch.zeros(2, 0, dtype=torch.long), [5, 3]),
}

# Item 2 of issue 19: torch's checks of index shapes and dtypes, at the call.
CHECKS = {
    "index_select_float_index": lambda d: _t(3, 4).to(d).index_select(0, torch.tensor([0.0, 1.0]).to(d)),
    "mask_count_mismatch": _mask_count,
    "pending_mask_count_mismatch": _pending_mask_count,
    "mask_count_mismatch_accumulate": _acc((3, 4), _bools(1, 0, 1), torch.ones(3, 4)),
    "mask_count_mismatch_column": _put((3, 4), _bools(1, 0, 1), torch.ones(3, 1)),
    "mask_count_empty_value": _put((4,), _bools(1, 1, 1, 1), torch.tensor([])),
    "mask_count_matches": _put((3, 4), _bools(1, 0, 1), torch.ones(2, 4)),
    "mask_shape_mismatch": _get((3, 4), _bools(1, 0)),
    "mask_shape_mismatch_set": _put((3, 4), _bools(1, 0), 1.0),
    "mask_2d_shape_mismatch": _get((5, 4, 3), torch.zeros(4, 4, dtype=torch.bool)),
    "mask_past_the_last_dim": lambda d: torch.ops.aten.index_put(
        _t(3, 4, 5).to(d), [None, None, torch.zeros(5, 2, dtype=torch.bool).to(d)], torch.ones(1).to(d)
    ),
    "indices_do_not_broadcast": _get((5, 5), (torch.tensor([0, 1]), torch.tensor([0, 1, 2]))),
    "indices_do_not_broadcast_set": _put((5, 5), ([0, 1], [0, 1, 2]), 0.0),
    "too_many_indices": _get((3, 4), (torch.tensor([0]),) * 3),
    "too_many_indices_put": lambda d: torch.ops.aten.index_put(
        _t(3, 4).to(d), [torch.tensor([0]).to(d)] * 3, torch.ones(1).to(d)
    ),
    "index_into_an_empty_dim": lambda d: torch.empty(10, 0).to(d)[:, [0, 1]],
    "index_into_an_empty_dim_set": _put((10, 0), (slice(None), torch.tensor([0, 1])), 1.0),
    "empty_index_into_an_empty_dim": lambda d: torch.empty(10, 0).to(d)[[], []],
    "index_copy_at_a_scalar_index": lambda d: (
        torch.tensor([2.0]).to(d).index_copy_(0, torch.tensor(0).to(d), torch.tensor([5.0]).to(d))
    ),
    "index_add_one_element_into_a_scalar": lambda d: (
        torch.tensor(2.0).to(d).index_add_(0, torch.tensor([0]).to(d), torch.tensor([3.0]).to(d))
    ),
    "index_add_a_scalar_into_one_element": lambda d: (
        torch.tensor([2.0]).to(d).index_add_(0, torch.tensor(0).to(d), torch.tensor(3.0).to(d))
    ),
    "value_shape_mismatch": _put((5, 5), torch.tensor([0, 1]), torch.ones(3, 5)),
    "value_shape_mismatch_apart": _put(
        (5, 4, 3), (torch.tensor([0, 1]), slice(None), torch.tensor([0, 1])), torch.ones(4, 2)
    ),
    "value_shape_apart": _put((5, 4, 3), (torch.tensor([0, 1]), slice(None), torch.tensor([0, 1])), _t(2, 4)),
    "value_dtype_mismatch": _put((3, 4), torch.tensor([0]), torch.ones(4, dtype=torch.float64)),
    "value_dtype_mismatch_mask": _put((3, 4), _bools(1, 0, 1), torch.ones(4, dtype=torch.float64)),
    "one_value_of_another_dtype_fills_a_mask": _put((3, 4), _bools(1, 0, 1), torch.tensor(5)),
    "no_index_into_a_scalar": lambda d: torch.rand([]).to(d).index_put([], torch.tensor([1.0]).to(d), True),
    "masked_scatter_byte_mask": lambda d: (
        _t(3, 4).to(d).masked_scatter(torch.ones(3, 4, dtype=torch.uint8).to(d), _t(3, 4).to(d))
    ),
    "index_fill_complex_value": lambda d: (
        torch.tensor([[1, 2], [4, 5]]).to(d).index_fill_(1, torch.tensor([0]).to(d), 1 + 1j)
    ),
    "nll_loss_byte_target": lambda d: F.nll_loss(
        _t(3, 4).to(d).log_softmax(1), torch.tensor([0, 3, 1], dtype=torch.uint8).to(d)
    ),
    "bincount_byte": lambda d: torch.bincount(torch.tensor([0, 3, 3], dtype=torch.uint8).to(d)),
    "bincount_short": lambda d: torch.bincount(torch.tensor([2, 0], dtype=torch.int16).to(d)),
}


def _index_of(dtype, shape):
    return lambda d: torch.zeros(shape, dtype=dtype).to(d)


# Ops given an index of each dtype: a function of a device and an index maker.
INDEX_OPS = {
    "gather": lambda d, i: _t(3, 4).to(d).gather(1, i((3, 2))),
    "scatter": lambda d, i: _t(3, 4).to(d).scatter(1, i((3, 2)), _t(3, 4).to(d)),
    "scatter_add": lambda d, i: _t(3, 4).to(d).scatter_add(1, i((3, 2)), _t(3, 4).to(d)),
    "scatter_reduce": lambda d, i: _t(3, 4).to(d).scatter_reduce(1, i((3, 2)), _t(3, 4).to(d), "amax"),
    "take_along_dim": lambda d, i: torch.take_along_dim(_t(3, 4).to(d), i((3, 2)), 1),
    "index_add": lambda d, i: _t(3, 4).to(d).index_add(0, i((2,)), _t(2, 4).to(d)),
    "index_copy": lambda d, i: _t(3, 4).to(d).index_copy(0, i((2,)), _t(2, 4).to(d)),
    "index_fill": lambda d, i: _t(3, 4).to(d).index_fill(0, i((2,)), 1.0),
    "index_reduce": lambda d, i: _t(3, 4).to(d).index_reduce(0, i((2,)), _t(2, 4).to(d), "prod"),
    "index_select": lambda d, i: _t(3, 4).to(d).index_select(0, i((2,))),
    "take": lambda d, i: _t(3, 4).to(d).take(i((2,))),
    "put_": lambda d, i: _t(3, 4).to(d).put_(i((2,)), torch.ones(2).to(d)),
    "embedding": lambda d, i: F.embedding(i((2,)), _t(3, 4).to(d)),
    "index_put": lambda d, i: _t(3, 4).to(d).index_put((i((2,)),), torch.ones(4).to(d)),
    "setitem": lambda d, i: _set(_t(3, 4).to(d), i((2,)), 1.0),
    "nll_loss_target": lambda d, i: F.nll_loss(_t(3, 4).to(d), i((3,))),
}
INDEX_DTYPES = (torch.float32, torch.bool, torch.int32, torch.int16, torch.uint8)

CASES = {
    **MASKS,
    **CHECKS,
    **{
        f"{op}_{str(dtype).removeprefix('torch.')}_index": (
            lambda d, op=op, dtype=dtype: INDEX_OPS[op](d, lambda shape: _index_of(dtype, shape)(d))
        )
        for op in INDEX_OPS
        for dtype in INDEX_DTYPES
    },
}


# lazytpu's own (a CPU fallback), and torch's once per process (index_reduce is in beta)
_IGNORED_WARNINGS = re.compile(r"^lazytpu|is in beta")


def _outcome(fn, device: str):
    """What ``fn(device)`` returns (on the host) or raises, and torch's warnings.
    A value is read outside the ``try``: a tpu error raised at the read and not
    at the call fails the test."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            out = fn(device)
        except Exception as exc:  # noqa: BLE001 - the point is to compare whatever is raised
            out = exc
        torch_warnings = [str(w.message) for w in caught if not _IGNORED_WARNINGS.search(str(w.message))]
    if isinstance(out, Exception):
        return ("raised", type(out), re.sub(r"(?<![a-z])tpu(:0)?(?![a-z])", "cpu", str(out))), torch_warnings
    return ("returned", to_cpu(out)), torch_warnings


@pytest.mark.parametrize("mode_name", MODES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_indexing_as_cpu_torch(name, mode_name):
    expected, expected_warnings = _outcome(CASES[name], "cpu")
    with mode(mode_name):
        actual, actual_warnings = _outcome(CASES[name], "tpu")
    if expected[0] == "raised":
        assert actual[:2] == expected[:2], (actual, expected)
        assert actual[2] == expected[2]
    else:
        assert actual[0] == "returned", actual
        assert_close(actual[1], expected[1])
    assert actual_warnings == expected_warnings


def test_a_lone_mask_is_written_without_a_sync():
    """``x[mask] = v`` with one value row (a broadcast) reads nothing: the mask
    stays pending, and the write fuses with what computes it."""
    x = _t(4, 3).to("tpu")
    lazytpu.sync()
    lazytpu.metrics.reset()
    x[x > 4] = 0.0
    x[(x[:, 0] > 1)] = torch.tensor([7.0, 8.0, 9.0]).to("tpu")
    assert lazytpu.metrics.snapshot()["syncs"] == {}
    expected = _t(4, 3)
    expected[expected > 4] = 0.0
    expected[expected[:, 0] > 1] = torch.tensor([7.0, 8.0, 9.0])
    assert torch.equal(x.cpu(), expected)


def test_a_counted_mask_reads_it_once_computed():
    """A value with one row per True position needs the count: one host read
    of the mask, no CPU fallback, and the write itself is recorded."""
    x = _t(4, 3).to("tpu")
    mask = torch.tensor([True, False, True, False]).to("tpu")
    lazytpu.sync()
    lazytpu.metrics.reset()
    x[mask] = torch.ones(2, 3).to("tpu")
    snap = lazytpu.metrics.snapshot()
    assert snap["syncs"] == {} and snap["cpu_fallbacks"] == {}
    assert torch.equal(x.cpu()[[0, 2]], torch.ones(2, 3))


def test_a_pending_counted_mask_syncs_once():
    """A pending mask whose count is needed is computed by one sync (reason
    "data_dependent", docs/sync_points.md); the write is recorded after it."""
    x = _t(4, 3).to("tpu")
    lazytpu.sync()
    lazytpu.metrics.reset()
    x[x[:, 0] > 4] = torch.ones(2, 3).to("tpu")
    snap = lazytpu.metrics.snapshot()
    assert snap["syncs"] == {"data_dependent": 1} and snap["cpu_fallbacks"] == {}
    expected = _t(4, 3)
    expected[expected[:, 0] > 4] = torch.ones(2, 3)
    assert torch.equal(x.cpu(), expected)


@pytest.mark.parametrize("op", [torch.Tensor.put, torch.Tensor.put_])
def test_put_without_accumulate_alerts_in_deterministic_mode_as_cpu(op):
    """``put_`` writes repeated indices in no defined order: under
    ``torch.use_deterministic_algorithms(True)`` it raises at every call, as
    CPU's kernel does, and changes nothing (Note [Determinism alerts])."""
    before = torch.are_deterministic_algorithms_enabled()
    a = torch.arange(4.0, device="tpu")
    index, values = torch.tensor([0, 0], device="tpu"), torch.tensor([5.0, 6.0], device="tpu")
    torch.use_deterministic_algorithms(True)
    try:
        for _ in range(2):
            with pytest.raises(RuntimeError, match="^put_ does not have a deterministic implementation"):
                op(a, index, values)
        summed = op(a.clone(), index, values, accumulate=True)  # deterministic: allowed
    finally:
        torch.use_deterministic_algorithms(before)
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0] and summed.tolist() == [11.0, 1.0, 2.0, 3.0]
