"""CPU torch's checks that read data hold on tpu by default (Note [Value checks]).

The check is computed inside the op's program and read at the next host read:
torch's exception type and message, naming the op and the line that recorded
it; the values that depend on the op fail with it, every other value keeps
its result, and no program is added or cut.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import MODES, mode, programs_run

import lazytpu
from lazytpu import _config
from lazytpu.frontend import record

aten = torch.ops.aten
X = torch.arange(6.0).reshape(3, 2)
BAD = torch.tensor([0, 5])
ONES = torch.ones(2, 2)


def _ints(device: str) -> torch.Tensor:
    return torch.zeros(3, dtype=torch.int32).to(device)


def _mask(device: str) -> torch.Tensor:
    return torch.tensor([True, False, True]).to(device)


def _nan_matrix(device: str, value: float = float("nan")) -> torch.Tensor:
    a = torch.zeros(3, 3)  # zeros elsewhere, as the replay's (an eigh error code depends on every value)
    a[2, 0] = value  # in the lower triangle, which eigh reads
    return a.to(device)


def _x(device: str) -> torch.Tensor:
    return X.clone().to(device)  # a copy on CPU too: in-place cases must not change X


# name -> (fn(dev), the op named in the error)
CASES = {
    "index": (lambda d: _x(d)[BAD.to(d)], aten.index.Tensor),
    "index_negative": (lambda d: _x(d)[torch.tensor([0, -4]).to(d)], aten.index.Tensor),
    "index_second_dim": (lambda d: _x(d)[torch.tensor([0]).to(d), torch.tensor([2]).to(d)], aten.index.Tensor),
    "setitem": (lambda d: _x(d).__setitem__(BAD.to(d), 1.0), aten.index_put.default),
    "index_put_accumulate": (
        lambda d: _x(d).index_put_((BAD.to(d),), torch.tensor(1.0).to(d), accumulate=True),
        aten.index_put.default,
    ),
    "gather": (lambda d: torch.gather(_x(d), 0, torch.tensor([[0, 5]]).to(d)), aten.gather.default),
    "gather_negative": (lambda d: torch.gather(_x(d), 1, torch.tensor([[0, -1]]).to(d)), aten.gather.default),
    "index_select": (lambda d: _x(d).index_select(0, BAD.to(d)), aten.index_select.default),
    "embedding": (lambda d: F.embedding(BAD.to(d), _x(d)), aten.embedding.default),
    "scatter": (lambda d: _x(d).scatter(0, torch.tensor([[5, 0]]).to(d), 1.0), aten.scatter.value),
    "scatter_add_": (
        lambda d: _x(d).scatter_add_(0, torch.tensor([[5, 0]]).to(d), torch.ones(1, 2).to(d)),
        aten.scatter_add.default,
    ),
    "scatter_reduce": (
        lambda d: _x(d).scatter_reduce(0, torch.tensor([[5, 0]]).to(d), torch.ones(1, 2).to(d), "amax"),
        aten.scatter_reduce.two,
    ),
    "index_add_": (lambda d: _x(d).index_add_(0, BAD.to(d), ONES.to(d)), aten.index_add.default),
    "index_copy": (lambda d: _x(d).index_copy(0, BAD.to(d), ONES.to(d)), aten.index_copy.default),
    "index_fill": (lambda d: _x(d).index_fill(0, BAD.to(d), 1.0), aten.index_fill.int_Scalar),
    "take": (lambda d: torch.take(_x(d), torch.tensor([7]).to(d)), aten.take.default),
    "put_": (lambda d: _x(d).put_(torch.tensor([-7]).to(d), torch.tensor([1.0]).to(d)), aten.put.default),
    "cross_entropy": (lambda d: F.cross_entropy(_x(d), torch.tensor([0, 5, 1]).to(d)), aten.nll_loss_forward.default),
    "nll_loss_negative": (lambda d: F.nll_loss(_x(d), torch.tensor([0, -1, 1]).to(d)), aten.nll_loss_forward.default),
    "nll_loss2d": (
        lambda d: F.nll_loss(torch.zeros(1, 3, 2, 2).to(d), torch.tensor([[[0, 5], [1, 1]]]).to(d)),
        aten.nll_loss2d_forward.default,
    ),
    "embedding_bag": (
        lambda d: F.embedding_bag(torch.tensor([[1, 12]]).to(d), _x(d), mode="max"),
        aten._embedding_bag_forward_only.default,
    ),
    "embedding_bag_first_offset": (
        lambda d: F.embedding_bag(torch.tensor([1, 2, 0]).to(d), _x(d), torch.tensor([1, 2]).to(d)),
        aten._embedding_bag_forward_only.default,
    ),
    "embedding_bag_offsets_decrease": (
        lambda d: F.embedding_bag(torch.tensor([1, 2, 0]).to(d), _x(d), torch.tensor([0, 2, 1]).to(d)),
        aten._embedding_bag_forward_only.default,
    ),
    "embedding_bag_offsets_past_the_end": (
        lambda d: F.embedding_bag(torch.tensor([1, 2, 0]).to(d), _x(d), torch.tensor([0, 5]).to(d)),
        aten._embedding_bag_forward_only.default,
    ),
    "one_hot": (lambda d: F.one_hot(BAD.to(d), 3), aten.one_hot.default),
    "one_hot_negative": (lambda d: F.one_hot(torch.tensor([0, -1]).to(d), 3), aten.one_hot.default),
    "masked_fill_overflow": (
        lambda d: _ints(d).masked_fill(_mask(d), torch.tensor(1e20).to(d)),
        aten.masked_fill.Tensor,
    ),
    "masked_fill_nan": (lambda d: _ints(d).masked_fill_(_mask(d), torch.tensor(float("nan"))), aten.masked_fill.Tensor),
    "masked_scatter_count": (
        lambda d: torch.zeros(4).to(d).masked_scatter_(_mask(d).repeat(2)[:4], torch.ones(1).to(d)),
        aten.masked_scatter.default,
    ),
    "masked_scatter_broadcast_mask": (
        lambda d: torch.zeros(2, 3).to(d).masked_scatter(_mask(d), torch.ones(3).to(d)),
        aten.masked_scatter.default,
    ),
    "multinomial_negative": (lambda d: torch.multinomial(torch.tensor([0.5, -0.1]).to(d), 1), aten.multinomial.default),
    "multinomial_nan": (
        lambda d: torch.multinomial(torch.tensor([0.5, float("nan")]).to(d), 1),
        aten.multinomial.default,
    ),
    "multinomial_zero_row": (
        lambda d: torch.multinomial(torch.tensor([[0.5, 0.5], [0.0, 0.0]]).to(d), 1),
        aten.multinomial.default,
    ),
    "bernoulli": (lambda d: torch.bernoulli(torch.tensor([0.5, 1.5]).to(d)), aten.bernoulli.default),
    "bernoulli_tensor_p": (
        lambda d: torch.zeros(2).to(d).bernoulli_(torch.tensor([0.5, -1.5]).to(d)),
        aten.bernoulli.Tensor,
    ),
    "normal_std": (
        lambda d: torch.normal(torch.zeros(2).to(d), torch.tensor([1.0, -1.0]).to(d)),
        aten.normal.Tensor_Tensor,
    ),
    "floor_divide": (lambda d: torch.tensor([1, 2]).to(d) // torch.tensor([1, 0]).to(d), aten.floor_divide.default),
    "div_trunc": (
        lambda d: torch.div(torch.tensor([1, 2]).to(d), torch.tensor([1, 0]).to(d), rounding_mode="trunc"),
        aten.div.Tensor_mode,
    ),
    "remainder": (lambda d: torch.tensor([1, 2]).to(d) % torch.tensor([1, 0]).to(d), aten.remainder.Tensor),
    "fmod": (lambda d: torch.fmod(torch.tensor([1, 2]).to(d), torch.tensor([1, 0]).to(d)), aten.fmod.Tensor),
    "segment_lengths_sum": (
        lambda d: torch._segment_reduce(
            torch.ones(2, 6).to(d), "sum", lengths=torch.tensor([[0, 3, 3], [2, 3, 0]]).to(d), axis=1
        ),
        aten.segment_reduce.default,
    ),
    "segment_lengths_negative": (
        lambda d: torch._segment_reduce(torch.ones(3).to(d), "max", lengths=torch.tensor([4, -1]).to(d)),
        aten.segment_reduce.default,
    ),
    "fake_quantize_zero_point": (  # a per-channel zero point outside [quant_min, quant_max]
        lambda d: torch.fake_quantize_per_channel_affine(
            _x(d), torch.ones(2).to(d), torch.tensor([0, 9], dtype=torch.int32).to(d), 1, 0, 7
        ),
        aten.fake_quantize_per_channel_affine_cachemask.default,
    ),
    "searchsorted_sorter": (  # the search never visits the bad index: CPU checks them all
        lambda d: torch.searchsorted(
            torch.arange(8.0).to(d), torch.tensor([-5.0]).to(d), sorter=torch.tensor([0, 1, 2, 3, 4, 5, 6, 99]).to(d)
        ),
        aten.searchsorted.Tensor,
    ),
    "repeat_interleave_sum": (
        lambda d: torch.repeat_interleave(torch.tensor([1, 2]).to(d), output_size=4),
        aten.repeat_interleave.Tensor,
    ),
    "repeat_interleave_negative": (  # the sum is right (CPU's next check)
        lambda d: torch.repeat_interleave(torch.tensor([3, 0, -1]).to(d), output_size=2),
        aten.repeat_interleave.Tensor,
    ),
    "repeat_interleave_negative_sum": (
        lambda d: torch.repeat_interleave(torch.tensor([-1, 0]).to(d), output_size=0),
        aten.repeat_interleave.Tensor,
    ),
    "binary_cross_entropy_above_one": (
        lambda d: F.binary_cross_entropy(torch.tensor([0.5, 1.5]).to(d), torch.tensor([0.0, 1.0]).to(d)),
        aten.binary_cross_entropy.default,
    ),
    "histc_range_of_inf": (lambda d: torch.histc(torch.tensor([0.0, 1.0, float("inf")]).to(d)), aten.histc.default),
    "histc_range_of_nan": (lambda d: torch.histc(torch.tensor([1.0, float("nan")]).to(d), 4), aten.histc.default),
    # Note [Non-finite matrices]
    "svd_nan": (lambda d: torch.linalg.svd(_nan_matrix(d)), aten._linalg_svd.default),
    "matrix_rank_nan": (lambda d: torch.linalg.matrix_rank(_nan_matrix(d)), aten._linalg_svd.default),
    "svd_batch_nan": (
        lambda d: torch.linalg.svdvals(torch.stack([torch.eye(3).to(d), _nan_matrix(d)])),
        aten._linalg_svd.default,
    ),
    "pinv_nan": (lambda d: torch.linalg.pinv(_nan_matrix(d).double()), aten.linalg_pinv.atol_rtol_tensor),
    "pinv_hermitian_inf": (
        lambda d: torch.linalg.pinv(_nan_matrix(d, float("inf")), hermitian=True),
        aten.linalg_pinv.atol_rtol_tensor,
    ),
    "eigh_nan": (lambda d: torch.linalg.eigh(_nan_matrix(d)), aten._linalg_eigh.default),
    "eigh_upper_inf": (
        lambda d: torch.linalg.eigh(_nan_matrix(d, float("inf")).mT, UPLO="U"),
        aten._linalg_eigh.default,
    ),
    "eig_inf": (lambda d: torch.linalg.eig(_nan_matrix(d, float("-inf")).to(torch.complex64)), aten.linalg_eig.default),
}

# the in-place index writes of CASES -> their target's value before the call, which it keeps
# (Note [Failed writes change nothing] in lazytpu.frontend.checks.value_checks)
KEPT = {
    "index_put_accumulate": X,
    "scatter_add_": X,
    "index_add_": X,
    "put_": X,
    "masked_scatter_count": torch.zeros(4),
    "masked_fill_nan": torch.zeros(3, dtype=torch.int32),
    "bernoulli_tensor_p": torch.zeros(2),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("eager_mode", MODES)
def test_bad_values_raise_torchs_error_at_the_next_host_read(name, eager_mode):
    fn, op = CASES[name]
    with pytest.raises(Exception) as expected:
        fn("cpu")
    keep = torch.arange(4.0).to("tpu")
    keep.cpu()
    with mode(eager_mode):
        keep.mul_(2)  # a pending in-place update of a materialized tensor
        line = fn.__code__.co_firstlineno
        out = fn("tpu")  # not raised here: the values are on the device
        unrelated = keep + 1
        with pytest.raises(Exception) as actual:
            unrelated.cpu()  # the next host read
    assert type(actual.value) is type(expected.value)
    assert str(actual.value) == f"{expected.value} ({op} recorded at {__file__}:{line})"
    assert unrelated.cpu().tolist() == [1.0, 3.0, 5.0, 7.0]  # computed all the same
    assert keep.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    if name in KEPT:  # an in-place index write that failed wrote nothing
        assert out.cpu().tolist() == KEPT[name].tolist()
    elif isinstance(out, torch.Tensor):  # the op's own result carries the error
        with pytest.raises(RuntimeError, match="could not be computed"):
            out.cpu()


@pytest.mark.parametrize("name", list(CASES))
def test_strict_blocking_mode_raises_at_the_op(name):
    """strict-blocking waits for each op's program: a bad value raises at the op's
    line, as docs/modes.md says, and the op's result fails with it."""
    fn, op = CASES[name]
    with pytest.raises(Exception) as expected:
        fn("cpu")
    with mode("strict-blocking"):
        line = fn.__code__.co_firstlineno
        with pytest.raises(type(expected.value)) as actual:
            fn("tpu")
        assert str(actual.value) == f"{expected.value} ({op} recorded at {__file__}:{line})"
        assert (torch.arange(3).to("tpu") + 1).cpu().tolist() == [1, 2, 3]  # nothing left to raise


@pytest.mark.parametrize("name", ["put_", "index_add_", "scatter_add_", "bernoulli_tensor_p"])
def test_an_inplace_ops_first_call_keeps_its_target_in_strict_mode(name):
    """As in a fresh process, where the functional op's route is not chosen yet:
    a failed in-place op keeps its target, as on every later call."""
    fn, op = CASES[name]
    record.ROUTES.pop(record.ROUTES[op].functional if op in record.ROUTES else op, None)
    record.ROUTES.pop(op, None)
    with mode("strict"):
        out = fn("tpu")
        with pytest.raises((IndexError, RuntimeError), match=r"recorded at"):
            out.cpu()
        assert out.cpu().tolist() == KEPT[name].tolist()


def _view_of_rows(d):
    base = torch.arange(12.0).reshape(4, 3).to(d)
    base[1:3].index_copy_(1, torch.tensor([0, 3]).to(d), torch.ones(2, 2).to(d))  # a view's write
    return base


# name -> fn(device) -> the target of a failed in-place index write, or the
# write itself when it returns its target
WRITES = {
    "setitem": lambda d: _written(_x(d), lambda t: t.__setitem__(torch.tensor([0, 7]).to(d), 100.0)),
    "setitem_negative": lambda d: _written(_x(d), lambda t: t.__setitem__(torch.tensor([-7, 1]).to(d), 50.0)),
    "setitem_two_indices": lambda d: _written(
        _x(d), lambda t: t.__setitem__((torch.tensor([0, 1]).to(d), torch.tensor([1, 2]).to(d)), 9.0)
    ),
    "setitem_of_a_view": lambda d: _written(
        torch.arange(12.0).reshape(4, 3).to(d), lambda t: t[1:3].__setitem__(torch.tensor([2, 0]).to(d), 7.0)
    ),
    "index_copy_of_a_view": _view_of_rows,
    "index_put_": lambda d: _x(d).index_put_((torch.tensor([1, -4]).to(d),), torch.tensor(5.0).to(d)),
    "index_copy_": lambda d: _x(d).index_copy_(0, torch.tensor([1, 3]).to(d), ONES.to(d)),
    "index_fill_": lambda d: _x(d).index_fill_(1, torch.tensor([1, -3]).to(d), -1.0),
    "index_add_": lambda d: _x(d).index_add_(0, torch.tensor([2, 3]).to(d), ONES.to(d), alpha=2),
    "index_reduce_": lambda d: _x(d).index_reduce_(0, torch.tensor([0, 3]).to(d), ONES.to(d) * 3, "prod"),
    "scatter_": lambda d: _x(d).scatter_(1, torch.tensor([[0, 2]]).to(d), 8.0),
    "scatter_src": lambda d: _x(d).scatter_(0, torch.tensor([[1, 3]]).to(d), ONES.to(d)),
    "scatter_reduce_mean": lambda d: _x(d).scatter_reduce_(
        0, torch.tensor([[1, 3]]).to(d), ONES.to(d), "mean", include_self=False
    ),
    "put_accumulate": lambda d: _x(d).put_(torch.tensor([0, 6]).to(d), torch.ones(2).to(d), accumulate=True),
    "masked_scatter_": lambda d: _x(d).masked_scatter_(torch.ones(3, 2, dtype=torch.bool).to(d), torch.ones(5).to(d)),
    "zero_dim": lambda d: torch.tensor(3.0).to(d).index_fill_(0, torch.tensor(1).to(d), 0.0),
    "floor_divide_": lambda d: _x(d).long().floor_divide_(torch.tensor([1, 0]).to(d)).float(),
    "remainder_of_a_view": lambda d: _written(
        torch.arange(12.0).reshape(4, 3).long().to(d), lambda t: t[1:3].remainder_(torch.tensor([[1, 0, 1]]).to(d))
    ).float(),
    "ifloordiv_wider_divisor": lambda d: _written(
        _x(d).int(), lambda t: t.__ifloordiv__(torch.tensor([0, 1]).to(d))
    ).float(),
    "masked_fill_": lambda d: _x(d).long().masked_fill_(torch.tensor([True, False]).to(d), torch.tensor(1e30)).float(),
    "bernoulli_": lambda d: _x(d).bernoulli_(torch.tensor([0.5, 1.5]).to(d)),
}


def _written(target, write):
    write(target)
    return target


@pytest.mark.parametrize("name", list(WRITES))
@pytest.mark.parametrize("eager_mode", MODES)
def test_a_failed_index_write_leaves_its_target_as_it_was(name, eager_mode):
    """Note [Failed writes change nothing] in lazytpu.frontend.checks.value_checks:
    torch's error at the next host read, and then the target, and what was
    computed from it since, read as if the write had not run (CPU wrote the
    elements before the bad one, part of them in some of these cases)."""
    unchanged = torch.arange(12.0).reshape(4, 3) if "view" in name else X
    with pytest.raises((IndexError, RuntimeError)) as expected:
        WRITES[name]("cpu")
    with mode(eager_mode):
        target = WRITES[name]("tpu")
        doubled = target * 2
        with pytest.raises(type(expected.value), match=r"recorded at"):
            target.cpu()
        expect = torch.tensor(3.0) if name == "zero_dim" else unchanged
        assert target.cpu().tolist() == expect.tolist()
        assert doubled.cpu().tolist() == (expect * 2).tolist()
        target.add_(1)  # and it goes on being used
        assert target.cpu().tolist() == (expect + 1).tolist()


@pytest.mark.parametrize("eager_mode", MODES)
def test_a_failed_functional_index_write_fails_its_result(eager_mode):
    """``y = x.index_put(...)`` with a bad index makes a tensor CPU never made:
    it fails, while ``x`` keeps its value."""
    with mode(eager_mode):
        x = _x("tpu")
        y = x.index_copy(0, torch.tensor([1, 3]).to("tpu"), ONES.to("tpu"))
        with pytest.raises(IndexError, match="index_copy_"):
            y.cpu()
        with pytest.raises(RuntimeError, match="could not be computed"):
            y.cpu()
        assert x.cpu().tolist() == X.tolist()


def test_strict_blocking_keeps_the_target_of_a_failed_index_write():
    with mode("strict-blocking"):
        x = _x("tpu")
        with pytest.raises(IndexError, match="index 7 is out of bounds"):
            x[torch.tensor([0, 7]).to("tpu")] = 1.0
        assert x.cpu().tolist() == X.tolist()


@pytest.mark.parametrize("eager_mode", MODES)
def test_values_computed_from_a_failed_op_in_later_programs_fail_with_it(eager_mode):
    """In strict mode each op is its own program, run before the check of the
    ops it reads is read (Note [Checks across programs] in lazytpu.engine_flush)."""
    target = torch.zeros(3, 2).to("tpu")
    target.cpu()
    with mode(eager_mode):
        picked = _x("tpu")[BAD.to("tpu")]
        shifted = picked + 1  # another program in strict mode
        target[1:].copy_(shifted)  # written into a materialized tensor
        kept = _x("tpu") * 2
        with pytest.raises(IndexError, match="index 5 is out of bounds"):
            shifted.cpu()
        for t in (picked, shifted, target):
            with pytest.raises(RuntimeError, match="could not be computed"):
                t.cpu()
        assert kept.cpu().tolist() == (X * 2).tolist()


@pytest.mark.parametrize("eager_mode", MODES)
def test_a_failed_random_op_spares_the_random_state(eager_mode):
    """A random op whose check fails fails its values, not the device's random
    state (Note [Failed checks spare the random state] in lazytpu.ir.node): the
    ops drawn after it, in the same program and later, compute (they failed
    with its error, for good: dropout after a bad ``normal`` in a notebook)."""
    with mode(eager_mode):
        bad = torch.normal(0.0, torch.tensor(-1.0).to("tpu"))
        drawn = torch.rand(3, device="tpu")
        twice = bad * 2
        with pytest.raises(RuntimeError, match="normal expects all elements of std >= 0.0"):
            bad.cpu()
        assert drawn.cpu().shape == (3,)
        with pytest.raises(RuntimeError, match="could not be computed"):
            twice.cpu()
        flips = torch.bernoulli(torch.tensor([0.5, 2.0]).to("tpu"))
        dropped = F.dropout(torch.ones(8).to("tpu"), 0.5)
        with pytest.raises(RuntimeError, match="Expected p_in >= 0 && p_in <= 1"):
            flips.cpu()
        assert set(dropped.cpu().tolist()) <= {0.0, 2.0}
        assert torch.rand(2, device="tpu").cpu().shape == (2,)


@pytest.mark.parametrize(
    "fn",
    [
        lambda d: _x(d)[torch.tensor([-3, 2]).to(d)],
        lambda d: torch.take(_x(d), torch.tensor([-6, 5]).to(d)),
        lambda d: F.cross_entropy(_x(d), torch.tensor([0, -100, 1]).to(d)),
        lambda d: F.nll_loss(_x(d), torch.tensor([0, 7, 1]).to(d), ignore_index=7),
        lambda d: torch.multinomial(torch.tensor([0.0, 1.0]).to(d), 1),
        lambda d: torch.bernoulli(torch.tensor([0.0, 1.0]).to(d)),
        lambda d: torch.tensor([1.0, 2.0]).to(d) // torch.tensor([1.0, 0.0]).to(d),
        lambda d: F.one_hot(torch.tensor([0, 2]).to(d), 3),
        lambda d: _ints(d).masked_fill(_mask(d), torch.tensor(-(2.0**31)).to(d)),
        lambda d: _x(d)[torch.tensor([], dtype=torch.long).to(d)],
        lambda d: _x(d).index_fill(1, torch.tensor([0, -1]).to(d), -1.0),
        lambda d: torch.tensor(3.0).to(d).index_fill(0, torch.tensor(-1).to(d), 0.0),
        lambda d: F.embedding_bag(torch.tensor([1, 2, 0, 1]).to(d), _x(d), torch.tensor([0, 2, 2, 4]).to(d)),
        lambda d: F.embedding_bag(torch.tensor([[1, 2], [0, 1]]).to(d), _x(d), mode="max"),
        lambda d: torch.searchsorted(torch.tensor([3.0, 1.0, 2.0]).to(d), 2.5, sorter=torch.tensor([1, 2, 0]).to(d)),
        lambda d: torch.repeat_interleave(torch.tensor([2, 0, 1]).to(d), output_size=3),
        lambda d: torch.repeat_interleave(_x(d), torch.tensor([0, 2, 1]).to(d), dim=0, output_size=3),
        lambda d: torch.repeat_interleave(torch.tensor([], dtype=torch.long).to(d), output_size=3),  # CPU: nothing
        lambda d: F.binary_cross_entropy(torch.tensor([0.0, 1.0]).to(d), torch.tensor([0.5, 1.0]).to(d)),
        lambda d: torch.histc(torch.tensor([0.0, 1.0, float("inf"), float("nan")]).to(d), 2, 0.0, 2.0),
    ],
)
def test_good_values_pass(fn):
    out = fn("tpu")
    torch.tpu.synchronize()
    assert out.cpu().tolist() == fn("cpu").tolist()


def test_eigvals_of_a_non_finite_matrix_raises_eigs_error():
    """CPU's eigvals of such a matrix crashes the process; eig's error is raised (Note [Non-finite matrices])."""
    with pytest.raises(RuntimeError, match=r"^torch.linalg.eig: input tensor should not contain infs or NaNs."):
        torch.linalg.eigvals(_nan_matrix("tpu")).cpu()


def test_eigh_reads_one_triangle_for_its_check_too():
    a = _nan_matrix("cpu")
    for fn in (lambda m: torch.linalg.eigvalsh(m.mT), lambda m: torch.linalg.eigvalsh(m, UPLO="U")):
        assert torch.equal(fn(a.to("tpu")).cpu(), fn(a))


@pytest.mark.parametrize("compute_uv", [True, False])
def test_svd_of_an_infinity_raises_the_error_of_a_nan(compute_uv):
    """CPU returns LAPACK's garbage; XLA:CPU's SVD never returned (Note [Non-finite matrices])."""
    a = _nan_matrix("tpu", float("-inf")).to(torch.complex64)
    out = torch.linalg.svd(a)[1] if compute_uv else torch.linalg.svdvals(a)
    with pytest.raises(torch.linalg.LinAlgError, match="the input matrix contained non-finite values"):
        out.cpu()
    solution = torch.linalg.lstsq(a, torch.ones(3, 1, dtype=a.dtype, device="tpu")).solution
    assert solution.cpu().isnan().all()


def test_a_checked_step_runs_one_program_and_waits_for_nothing():
    """The checks ride in the step's program; a flush does not read them, a host read does."""
    emb = torch.nn.Embedding(10, 4).to("tpu")
    head = torch.nn.Linear(4, 10).to("tpu")
    tokens = torch.tensor([[1, 2, 3], [4, 5, 11]]).to("tpu")  # 11 is out of range
    targets = torch.tensor([1, 2, 3, 4, 5, 6]).to("tpu")

    def step(t):
        return F.cross_entropy(head(emb(t)).reshape(-1, 10), targets)

    good = torch.tensor([[1, 2, 3], [4, 5, 6]]).to("tpu")
    step(good).item()
    assert programs_run(lambda: step(good).item()) == 1
    loss = step(tokens)
    lazytpu.sync()  # runs the program, reads nothing
    with pytest.raises(IndexError, match=r"index out of range in self \(aten\.embedding\.default recorded at"):
        loss.item()
    with pytest.raises(RuntimeError, match="could not be computed"):
        loss.item()  # the loss depends on the bad lookup
    assert programs_run(lambda: step(good).item()) == 1  # and the next steps run as before


def test_checks_can_be_turned_off():
    """LAZYTPU_VALUE_CHECKS=0: no check nodes, XLA's clamping (the speed ceiling of the checks)."""
    with _config.VALUE_CHECKS.override(False):
        out = _x("tpu")[BAD.to("tpu")]
        assert out.cpu().tolist() == [[0.0, 1.0], [4.0, 5.0]]  # index 5 clamped to 2
