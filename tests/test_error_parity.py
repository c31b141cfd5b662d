"""Error parity: bad calls raise on ``tpu`` what they raise on CPU torch —
same exception type, same message, raised at the call (not at a later sync).
"""

from __future__ import annotations

import re

import pytest
import torch


def _t(*shape, dtype=torch.float32):
    return torch.arange(float(torch.Size(shape).numel()), dtype=torch.float64).reshape(shape).to(dtype)


# Each case: a function of a device name that makes its inputs there and
# performs one bad call.
CASES = {
    "add_broadcast": lambda d: _t(2, 3).to(d) + _t(4).to(d),
    "mul_broadcast": lambda d: _t(2, 3).to(d) * _t(2, 4).to(d),
    "mm_shapes": lambda d: _t(2, 3).to(d) @ _t(4, 5).to(d),
    "bmm_batch": lambda d: torch.bmm(_t(2, 3, 4).to(d), _t(3, 4, 5).to(d)),
    "mm_dtype": lambda d: _t(2, 3).to(d) @ _t(3, 2, dtype=torch.float64).to(d),
    "matmul_1d": lambda d: _t(3).to(d) @ _t(4).to(d),
    "cat_dims": lambda d: torch.cat([_t(2, 3).to(d), _t(2, 4).to(d)]),
    "cat_empty_list": lambda d: torch.cat([]),
    "stack_shapes": lambda d: torch.stack([_t(2).to(d), _t(3).to(d)]),
    "view_bad_size": lambda d: _t(2, 3).to(d).view(4, 2),
    "view_noncontiguous": lambda d: _t(2, 3).to(d).t().view(6),
    "reshape_bad": lambda d: _t(2, 3).to(d).reshape(5, -1),
    "view_two_minus_one": lambda d: _t(2, 3).to(d).view(-1, -1),
    "sum_dim_range": lambda d: _t(2, 3).to(d).sum(5),
    "softmax_dim_range": lambda d: _t(2, 3).to(d).softmax(-3),
    "transpose_dim": lambda d: _t(2, 3).to(d).transpose(0, 2),
    "permute_len": lambda d: _t(2, 3).to(d).permute(0),
    "permute_repeat": lambda d: _t(2, 3).to(d).permute(0, 0),
    "squeeze_dim": lambda d: _t(2, 3).to(d).squeeze(4),
    "unsqueeze_dim": lambda d: _t(2, 3).to(d).unsqueeze(5),
    "select_index": lambda d: _t(2, 3).to(d).select(1, 7),
    "getitem_int_range": lambda d: _t(2, 3).to(d)[5],
    "getitem_too_many": lambda d: _t(2, 3).to(d)[0, 0, 0],
    "narrow_range": lambda d: _t(2, 3).to(d).narrow(1, 2, 3),
    "expand_bad": lambda d: _t(2, 3).to(d).expand(4, 3),
    "expand_fewer_dims": lambda d: _t(2, 3).to(d).expand(3),
    "split_zero": lambda d: _t(4).to(d).split(0),
    "chunk_zero": lambda d: _t(4).to(d).chunk(0),
    "flatten_range": lambda d: _t(2, 3).to(d).flatten(0, 4),
    "inplace_cast": lambda d: _t(3, dtype=torch.int64).to(d).add_(_t(3).to(d) * 0.5),
    "inplace_broadcast": lambda d: _t(3).to(d).add_(_t(2, 3).to(d)),
    "bitwise_float": lambda d: _t(3).to(d) & _t(3).to(d),
    "logical_and_shapes": lambda d: torch.logical_and(_t(3).to(d), _t(2).to(d)),
    "where_shapes": lambda d: torch.where(_t(3).to(d) > 1, _t(3).to(d), _t(4).to(d)),
    "index_float": lambda d: _t(4).to(d)[_t(2).to(d)],
    "gather_dims": lambda d: _t(2, 3).to(d).gather(1, torch.zeros(2, dtype=torch.int64).to(d)),
    "index_select_dim": lambda d: _t(2, 3).to(d).index_select(3, torch.zeros(1, dtype=torch.int64).to(d)),
    "cross_entropy_shape": lambda d: torch.nn.functional.cross_entropy(_t(4, 3).to(d), torch.zeros(5).long().to(d)),
    "nll_target_dtype": lambda d: torch.nn.functional.nll_loss(_t(4, 3).to(d), torch.zeros(4).to(d)),
    "linear_shapes": lambda d: torch.nn.functional.linear(_t(2, 3).to(d), _t(4, 5).to(d)),
    "embedding_float_idx": lambda d: torch.nn.functional.embedding(_t(2).to(d), _t(5, 3).to(d)),
    "layer_norm_shape": lambda d: torch.nn.functional.layer_norm(_t(2, 3).to(d), (4,)),
    "arange_step_zero": lambda d: torch.arange(0, 5, 0, device=d),
    "zeros_negative": lambda d: torch.zeros(-1, device=d),
    "randn_negative": lambda d: torch.randn(2, -3, device=d),
    "full_bad_dtype": lambda d: torch.full((2,), 1.5, dtype=torch.bool, device=d).add_(1.5),
    "item_many": lambda d: _t(3).to(d).item(),
    "bool_many": lambda d: bool(_t(3).to(d)),
    "backward_non_scalar": lambda d: _t(3).to(d).requires_grad_().mul(2).backward(),
    "backward_no_grad": lambda d: _t(3).to(d).sum().backward(),
    "backward_twice": lambda d: _twice(d),
    "leaf_inplace": lambda d: _t(3).to(d).requires_grad_().add_(1),
    "requires_grad_int": lambda d: _t(3, dtype=torch.int64).to(d).requires_grad_(),
    "cumsum_dim": lambda d: _t(2, 3).to(d).cumsum(2),
    "clamp_no_bounds": lambda d: _t(3).to(d).clamp(),
    "mvlgamma_p": lambda d: torch.mvlgamma(_t(3).to(d).abs() + 2, 0),
    # dtypes a CPU kernel rejects whatever the sizes (Note [Kernel checks] in kernel_checks.py)
    "gelu_int": lambda d: torch.nn.functional.gelu(_t(3, dtype=torch.int32).to(d)),
    "silu_int": lambda d: torch.nn.functional.silu(_t(3, dtype=torch.int64).to(d)),
    "softplus_int": lambda d: torch.nn.functional.softplus(_t(3, dtype=torch.int16).to(d)),
    "softmax_int_dim0": lambda d: _t(2, 3, dtype=torch.int32).to(d).softmax(0),
    "log_softmax_int_last_dim": lambda d: _t(2, 3, dtype=torch.int64).to(d).log_softmax(-1),
    "cross_entropy_int_logits": lambda d: torch.nn.functional.cross_entropy(
        _t(4, 3, dtype=torch.int64).to(d), torch.zeros(4).long().to(d)
    ),
    "nll_loss_int_input": lambda d: torch.nn.functional.nll_loss(
        _t(4, 3, dtype=torch.int32).to(d), torch.zeros(4).long().to(d)
    ),
    "var_int": lambda d: _t(3, dtype=torch.int32).to(d).var(),
    "std_int": lambda d: _t(2, 3, dtype=torch.int64).to(d).std(0),
    "addcmul_bool": lambda d: torch.addcmul(*[_t(3, dtype=torch.bool).to(d)] * 3),
    "lerp_int": lambda d: torch.lerp(_t(3, dtype=torch.int32).to(d), _t(3, dtype=torch.int32).to(d), 0.5),
    "histc_int": lambda d: torch.histc(_t(3, dtype=torch.int32).to(d)),
    "round_decimals_int": lambda d: torch.round(_t(3, dtype=torch.int32).to(d), decimals=2),
    "cholesky_int": lambda d: torch.linalg.cholesky(_t(2, 2, dtype=torch.int32).to(d)),
    "eigh_int": lambda d: torch.linalg.eigh(_t(2, 2, dtype=torch.int32).to(d)),
    "lu_int": lambda d: torch.linalg.lu(_t(2, 2, dtype=torch.int64).to(d)),
    "solve_triangular_int": lambda d: torch.linalg.solve_triangular(
        _t(2, 2, dtype=torch.int32).to(d), _t(2, 1, dtype=torch.int32).to(d), upper=True
    ),
    "geqrf_int": lambda d: torch.geqrf(_t(2, 2, dtype=torch.int32).to(d)),
    "lstsq_int": lambda d: torch.linalg.lstsq(_t(2, 2, dtype=torch.int32).to(d), _t(2, 1, dtype=torch.int32).to(d)),
}


def _twice(d):
    x = _t(3).to(d).requires_grad_()
    y = (x * x).sum()
    y.backward()
    y.backward()


def _outcome(fn, device):
    try:
        fn(device)
    except Exception as exc:  # noqa: BLE001 - the point is to compare whatever is raised
        return type(exc), str(exc)
    return None, None


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_error_as_cpu(name):
    cpu_type, cpu_message = _outcome(CASES[name], "cpu")
    assert cpu_type is not None, "the case must fail on CPU"
    tpu_type, tpu_message = _outcome(CASES[name], "tpu")
    assert tpu_type is cpu_type, (tpu_type, tpu_message, cpu_message)
    assert re.sub(r"(?<![a-z])tpu(:0)?(?![a-z])", "cpu", tpu_message) == cpu_message, (tpu_message, cpu_message)


def test_table_size():
    assert len(CASES) >= 40
