"""Error parity: bad calls raise on ``tpu`` what they raise on CPU torch —
same exception type, same message, raised at the call (not at a later sync).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from conftest import mode, no_fallback, run_both


def _t(*shape, dtype=torch.float32):
    return torch.arange(float(torch.Size(shape).numel()), dtype=torch.float64).reshape(shape).to(dtype)


# Each case: a function of a device name that makes its inputs there and
# performs one bad call.
CASES = {
    # out= dtypes that CPU kernels refuse (PyTorch's test_reductions.py on tpu)
    "all_out_float": lambda d: torch.all(_t(3, 4).to(d), 0, out=torch.empty(4).to(d)),
    "any_out_float_no_dim": lambda d: torch.any(_t(3, 4).to(d), out=torch.empty(()).to(d)),
    "mode_out_values_dtype": lambda d: torch.mode(
        _t(10, dtype=torch.uint8).to(d), -1, True, out=(_t(10, dtype=torch.int8).to(d), _t(10, dtype=torch.long).to(d))
    ),
    "heaviside_out_complex": lambda d: torch.heaviside(
        _t(3).to(d), _t(3).to(d), out=torch.empty(3, dtype=torch.complex64).to(d)
    ),
    "isposinf_out_float": lambda d: torch.isposinf(_t(3).to(d), out=torch.empty(3).to(d)),
    "isneginf_out_int": lambda d: torch.isneginf(_t(3).to(d), out=torch.empty(3, dtype=torch.int64).to(d)),
    "random_from_bool": lambda d: torch.empty(3, dtype=torch.bool, device=d).random_(-1, 1),
    "random_to_int8": lambda d: torch.empty(3, dtype=torch.int8, device=d).random_(0, 1000),
    "randint_complex": lambda d: torch.randint(6, (3,), dtype=torch.complex64, device=d),
    "complex_mixed_dtypes": lambda d: torch.complex(_t(2).to(d), _t(2, dtype=torch.float64).to(d)),
    "polar_mixed_dtypes": lambda d: torch.polar(_t(2).to(d), _t(2, dtype=torch.float64).to(d)),
    "logcumsumexp_out_dtype": lambda d: torch.logcumsumexp(
        _t(3, dtype=torch.float64).to(d), 0, out=torch.empty(3).to(d)
    ),
    "index_select_out_dtype": lambda d: torch.index_select(  # PyTorch's test_ops.py test_out: it cast silently
        _t(2, 2).to(d), 0, torch.tensor([1, 0]).to(d), out=torch.empty(2, 2, dtype=torch.long).to(d)
    ),
    "kthvalue_out_values_dtype": lambda d: torch.kthvalue(
        _t(3, 4).to(d), 2, out=(torch.empty(3, dtype=torch.long).to(d), torch.empty(3, dtype=torch.long).to(d))
    ),
    "kthvalue_out_indices_dtype": lambda d: torch.kthvalue(
        _t(3, 4).to(d), 2, out=(torch.empty(3).to(d), torch.empty(3, dtype=torch.int32).to(d))
    ),
    "index_add_source_shape": lambda d: torch.index_add(  # the message quotes the real shapes, not stand-ins'
        torch.zeros(3, 2).to(d), 0, torch.tensor([0, 1]).to(d), torch.ones(2).to(d)
    ),
    "nansum_out_long": lambda d: torch.nansum(_t(3, 4).to(d), 1, out=torch.empty(3, dtype=torch.long).to(d)),
    "nansum_out_bool": lambda d: torch.nansum(_t(3, 4).to(d), 1, out=torch.empty(3, dtype=torch.bool).to(d)),
    "std_out_complex": lambda d: torch.std(_t(3, 4).to(d), 1, out=torch.empty(3, dtype=torch.complex64).to(d)),
    "mean_out_long": lambda d: torch.mean(_t(3, 4).to(d), 1, out=torch.empty(3, dtype=torch.long).to(d)),
    "bucketize_2d_boundaries": lambda d: torch.bucketize(_t(3).to(d), _t(2, 2).to(d)),
    "searchsorted_0d_sequence": lambda d: torch.searchsorted(torch.tensor(1.0).to(d), _t(3).to(d)),
    "bucketize_0d_boundaries": lambda d: torch.bucketize(_t(3).to(d), torch.tensor(1.0).to(d)),
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
    "histc_bool": lambda d: torch.histc(_t(3, dtype=torch.bool).to(d)),  # integers count, as on CUDA
    "round_decimals_int": lambda d: torch.round(_t(3, dtype=torch.int32).to(d), decimals=2),
    "cholesky_int": lambda d: torch.linalg.cholesky(_t(2, 2, dtype=torch.int32).to(d)),
    "eigh_int": lambda d: torch.linalg.eigh(_t(2, 2, dtype=torch.int32).to(d)),
    "lu_int": lambda d: torch.linalg.lu(_t(2, 2, dtype=torch.int64).to(d)),
    "solve_triangular_int": lambda d: torch.linalg.solve_triangular(
        _t(2, 2, dtype=torch.int32).to(d), _t(2, 1, dtype=torch.int32).to(d), upper=True
    ),
    "geqrf_int": lambda d: torch.geqrf(_t(2, 2, dtype=torch.int32).to(d)),
    "lstsq_int": lambda d: torch.linalg.lstsq(_t(2, 2, dtype=torch.int32).to(d), _t(2, 1, dtype=torch.int32).to(d)),
    # kernels that check sizes first, checked on shaped stand-ins (_SHAPED in kernel_checks.py)
    "max_pool2d_bool": lambda d: F.max_pool2d(_t(1, 2, 5, 5, dtype=torch.bool).to(d), 3),
    "max_pool3d_bool_unbatched": lambda d: F.max_pool3d(_t(2, 4, 4, 4, dtype=torch.bool).to(d), 2),
    "max_pool2d_backward_bool": lambda d: torch.ops.aten.max_pool2d_with_indices_backward(
        _t(1, 1, 2, 2, dtype=torch.bool).to(d),
        _t(1, 1, 4, 4, dtype=torch.bool).to(d),
        [2, 2],
        [2, 2],
        [0, 0],
        [1, 1],
        False,
        torch.zeros(1, 1, 2, 2, dtype=torch.int64).to(d),
    ),
    "avg_pool2d_int": lambda d: F.avg_pool2d(_t(2, 3, 6, 6, dtype=torch.int32).to(d), 3, stride=2),
    "avg_pool3d_half": lambda d: F.avg_pool3d(_t(1, 1, 4, 4, 4, dtype=torch.float16).to(d), 2),
    "adaptive_avg_pool2d_int": lambda d: F.adaptive_avg_pool2d(_t(2, 3, 5, 5, dtype=torch.int64).to(d), 2),
    "adaptive_max_pool1d_uint8": lambda d: F.adaptive_max_pool1d(_t(2, 3, 5, dtype=torch.uint8).to(d), 2),
    "fractional_max_pool2d_int": lambda d: F.fractional_max_pool2d(
        _t(1, 1, 6, 6, dtype=torch.int32).to(d), 2, output_size=3, _random_samples=torch.full((1, 1, 2), 0.5).to(d)
    ),
    "interpolate_bilinear_int": lambda d: F.interpolate(
        _t(1, 2, 3, 3, dtype=torch.int32).to(d), scale_factor=2, mode="bilinear"
    ),
    "interpolate_nearest_bool": lambda d: F.interpolate(_t(1, 2, 3, dtype=torch.bool).to(d), size=7),
    "interpolate_bicubic_int": lambda d: F.interpolate(
        _t(1, 1, 3, 3, dtype=torch.int64).to(d), size=(5, 4), mode="bicubic"
    ),
    "interpolate_trilinear_uint8": lambda d: F.interpolate(
        _t(1, 1, 2, 2, 2, dtype=torch.uint8).to(d), scale_factor=2, mode="trilinear"
    ),
    "interpolate_area_int": lambda d: F.interpolate(_t(1, 2, 6, 6, dtype=torch.int32).to(d), size=3, mode="area"),
    "conv_transpose2d_int": lambda d: F.conv_transpose2d(
        _t(2, 4, 3, 3, dtype=torch.int32).to(d), _t(4, 3, 3, 3, dtype=torch.int32).to(d), stride=2, padding=1
    ),
    "conv_transpose1d_grouped_uint8": lambda d: F.conv_transpose1d(
        _t(1, 4, 5, dtype=torch.uint8).to(d), _t(4, 1, 3, dtype=torch.uint8).to(d), groups=2
    ),
    "conv2d_bool": lambda d: F.conv2d(_t(1, 2, 5, 5, dtype=torch.bool).to(d), _t(3, 2, 3, 3, dtype=torch.bool).to(d)),
    "grid_sample_int": lambda d: F.grid_sample(
        _t(1, 2, 4, 4, dtype=torch.int64).to(d), torch.zeros(1, 3, 3, 2, dtype=torch.int64).to(d), align_corners=False
    ),
    "max_unpool2d_bool": lambda d: F.max_unpool2d(
        _t(1, 1, 2, 2, dtype=torch.bool).to(d), torch.tensor([[[[0, 3], [8, 15]]]]).to(d), 2
    ),
    "unfold_int": lambda d: F.unfold(_t(1, 2, 4, 4, dtype=torch.int32).to(d), 2),
    "reflection_pad_bool": lambda d: F.pad(_t(1, 2, 5, dtype=torch.bool).to(d), (2, 2), mode="reflect"),
    "topk_bool": lambda d: _t(3, 4, dtype=torch.bool).to(d).topk(2),
    "cross_bool": lambda d: torch.linalg.cross(_t(2, 3, dtype=torch.bool).to(d), _t(2, 3, dtype=torch.bool).to(d)),
    # ops decomposed on tpu, checked before the decomposition (record.check_with_meta)
    "hardswish_int": lambda d: F.hardswish(_t(2, 3, dtype=torch.int64).to(d)),
    "hardsigmoid_uint8": lambda d: F.hardsigmoid(_t(4, dtype=torch.uint8).to(d)),
    "logsigmoid_int": lambda d: F.logsigmoid(_t(4, dtype=torch.int32).to(d)),
    "smooth_l1_loss_int": lambda d: F.smooth_l1_loss(_t(4, dtype=torch.int32).to(d), _t(4, dtype=torch.int32).to(d)),
    "multi_margin_loss_int": lambda d: F.multi_margin_loss(
        _t(2, 3, dtype=torch.int64).to(d), torch.tensor([0, 2]).to(d)
    ),
    "tanhshrink_bool": lambda d: F.tanhshrink(_t(3, dtype=torch.bool).to(d)),
    # kernels that return early on empty inputs, checked on one-element stand-ins
    "attention_int": lambda d: F.scaled_dot_product_attention(*[_t(1, 2, 3, 4, dtype=torch.int32).to(d)] * 3),
    "attention_dropout_int": lambda d: F.scaled_dot_product_attention(
        *[_t(2, 3, 4, dtype=torch.int64).to(d)] * 3, dropout_p=0.5, is_causal=True
    ),
    "mm_bool": lambda d: _t(2, 3, dtype=torch.bool).to(d) @ _t(3, 2, dtype=torch.bool).to(d),
    "argmax_bool": lambda d: _t(2, 3, dtype=torch.bool).to(d).argmax(),
    "relu_bool": lambda d: F.relu(_t(3, dtype=torch.bool).to(d)),
    "median_bool": lambda d: _t(2, 3, dtype=torch.bool).to(d).median(),
    "segment_reduce_int": lambda d: torch.segment_reduce(
        _t(4, dtype=torch.int64).to(d), "sum", lengths=torch.tensor([1, 3]).to(d)
    ),
    # an unknown reduction: lazytpu's lowerings computed a minimum, or failed in the program
    "segment_reduce_unknown": lambda d: torch.segment_reduce(
        _t(4).to(d), "maximum", lengths=torch.tensor([1, 3]).to(d)
    ),
    "scatter_reduce_unknown": lambda d: _t(3).to(d).scatter_reduce(0, torch.tensor([0, 1]).to(d), _t(2).to(d), "max_"),
    "index_reduce_max": lambda d: _t(3).to(d).index_reduce(0, torch.tensor([0, 1]).to(d), _t(2).to(d), "max"),
    "histogram_int": lambda d: torch.histogram(_t(5, dtype=torch.int32).to(d), bins=3),
    "histogramdd_half": lambda d: torch.histogramdd(_t(4, 2, dtype=torch.float16).to(d), bins=[2, 2]),
    "qr_half": lambda d: torch.linalg.qr(_t(3, 3, dtype=torch.float16).to(d)),
    "svd_bfloat16": lambda d: torch.linalg.svd(_t(3, 2, dtype=torch.bfloat16).to(d)),
    "eig_half": lambda d: torch.linalg.eig(_t(2, 2, dtype=torch.float16).to(d)),
    # embedding_bag's dims (PyTorch's test_embedding.py on tpu: outputs of some shape, no error)
    "embedding_bag_input_5d": lambda d: torch.embedding_bag(
        _t(2, 6).to(d), torch.zeros(2, 0, 0, 6, 6, dtype=torch.long).to(d), torch.zeros(2, dtype=torch.long).to(d)
    ),
    "embedding_bag_offsets_5d": lambda d: torch._embedding_bag(
        _t(2, 2).to(d), torch.ones(2, dtype=torch.long).to(d), torch.zeros(2, 0, 0, 6, 6, dtype=torch.long).to(d)
    ),
    "embedding_bag_weight_3d": lambda d: torch._embedding_bag_forward_only(
        _t(2, 2, 2).to(d), torch.ones(2, dtype=torch.long).to(d), torch.zeros(2, dtype=torch.long).to(d)
    ),
    "solve_half": lambda d: torch.linalg.solve(_t(2, 2, dtype=torch.float16).to(d), _t(2, dtype=torch.float16).to(d)),
    "ldl_factor_half": lambda d: torch.linalg.ldl_factor(_t(3, 3, dtype=torch.float16).to(d)),
    # random ops; their stand-ins' draws leave the CPU generator as it was
    "bernoulli_int": lambda d: torch.bernoulli(_t(3, dtype=torch.int64).to(d)),
    "multinomial_int": lambda d: torch.multinomial(_t(3, dtype=torch.int32).to(d) + 1, 2),
    "uniform_int": lambda d: _t(3, dtype=torch.int64).to(d).uniform_(),
    "randint_like_bool_high": lambda d: torch.randint_like(_t(3, dtype=torch.bool).to(d), 10),
    "normal_int_mean": lambda d: torch.normal(_t(3, dtype=torch.int32).to(d), _t(3).to(d)),
    "rrelu_int": lambda d: F.rrelu(_t(3, dtype=torch.int32).to(d), training=True),
    # messages that name the argument's type (Note [Type name])
    "add_str": lambda d: _t(3).to(d) + "a",
    "stack_of_a_tensor": lambda d: torch.stack(_t(3).to(d)),
    "masked_fill_str": lambda d: _t(3).to(d).masked_fill(_t(3).to(d) > 0, "a"),
}


# Calls that meta kernels accept and CPU kernels refuse, checked when the op
# is recorded, in both modes (make arg-sweep finds them): out-of-range dims
# (Note [Dim checks] in kernel_checks.py; before, the lowering wrapped the
# dim: sort(x, dim=2) of a 2-D tensor sorted dim 0) and index dtypes.
AT_CALL_CASES = {
    # PyTorch's test_nn.py on tpu: a 4-D input padded as 3-D by the meta kernel, then a lowering failure
    "reflection_pad1d_4d": lambda d: torch.ops.aten.reflection_pad1d(_t(3, 3, 10, 10).to(d), [1, 1]),
    "reflection_pad2d_empty_channels": lambda d: F.pad(_t(2, 0, 4, 4).to(d), (1, 1, 1, 1), mode="reflect"),
    "replication_pad3d_6d": lambda d: torch.ops.aten.replication_pad3d(_t(2, 3, 3, 3, 4, 4).to(d), [1] * 6),
    "one_hot_of_nothing": lambda d: F.one_hot(torch.empty(4, 0, dtype=torch.long).to(d)),
    # size checks of CPU kernels that meta kernels skip (Note [Meta shape fixes])
    "fractional_max_pool3d_few_samples": lambda d: torch.ops.aten.fractional_max_pool3d(
        _t(2, 2, 4, 4, 4).to(d), [2, 2, 2], [1, 1, 1], torch.rand(1, 2, 3).to(d)
    ),
    "fractional_max_pool3d_samples_of_other_channels": lambda d: torch.ops.aten.fractional_max_pool3d(
        _t(2, 4, 4, 4).to(d), [2, 2, 2], [1, 1, 1], torch.rand(1, 3, 3).to(d)
    ),
    "ctc_loss_empty_log_probs": lambda d: F.ctc_loss(
        torch.rand(0, 0, 4).to(d), *[torch.tensor([], dtype=torch.long).to(d)] * 3, reduction="none"
    ),
    "ctc_loss_empty_log_probs_int_lengths": lambda d: F.ctc_loss(
        torch.rand(0, 1, 4).to(d), torch.tensor([[1]]).to(d), [0], [1]
    ),
    "sort_dim_past_last": lambda d: _t(2, 3).to(d).sort(dim=2),
    "sort_negative_dim": lambda d: torch.sort(_t(2, 3).to(d), -3),
    "sort_stable_dim": lambda d: torch.sort(_t(4).to(d), dim=1, stable=True),
    "sort_scalar_dim": lambda d: torch.sort(_t().to(d), 1),
    "argsort_dim": lambda d: _t(2, 3, 4).to(d).argsort(dim=-4),
    "sort_descending_dim": lambda d: torch.sort(_t(3).to(d), dim=-2, descending=True),
    "cummax_scalar_dim": lambda d: torch.cummax(_t().to(d), 1),
    "cummin_scalar_negative_dim": lambda d: torch.cummin(_t().to(d), -2),
    "select_scatter_dim": lambda d: torch.select_scatter(_t(2, 3).to(d), _t(2).to(d), 2, 0),
    "select_scatter_negative_dim": lambda d: torch.select_scatter(_t(2, 3).to(d), _t(3).to(d), -3, 0),
    "diagonal_scatter_dim1": lambda d: torch.diagonal_scatter(_t(2, 3, 4).to(d), _t(4, 2).to(d), 0, 3, 0),
    "diagonal_scatter_dim2": lambda d: torch.diagonal_scatter(_t(2, 3, 4).to(d), _t(2, 2).to(d), 0, 0, -4),
    "index_select_scalar_dim": lambda d: torch.index_select(_t().to(d), 1, torch.zeros(1, dtype=torch.int64).to(d)),
    "ctc_loss_float_input_lengths": lambda d: F.ctc_loss(
        _t(5, 2, 4).to(d).log_softmax(2),
        torch.ones(2, 3).long().to(d),
        torch.full((2,), 5.0).to(d),
        torch.full((2,), 3).to(d),
    ),
    "ctc_loss_bool_target_lengths": lambda d: F.ctc_loss(
        _t(5, 2, 4).to(d).log_softmax(2),
        torch.ones(2, 3).long().to(d),
        torch.full((2,), 5).to(d),
        torch.ones(2).bool().to(d),
    ),
    "searchsorted_int32_sorter": lambda d: torch.searchsorted(
        _t(3).to(d), _t(2).to(d), sorter=torch.tensor([0, 1, 2], dtype=torch.int32).to(d)
    ),
    "searchsorted_uint8_sorter_right": lambda d: torch.searchsorted(
        _t(2, 3).to(d), _t(2, 1).to(d), right=True, sorter=torch.zeros(2, 3, dtype=torch.uint8).to(d)
    ),
    "repeat_interleave_float_repeats": lambda d: torch.repeat_interleave(_t(2).to(d), output_size=1),
    "repeat_interleave_2d_repeats": lambda d: torch.repeat_interleave(
        torch.ones(1, 2, dtype=torch.long).to(d), output_size=2
    ),
    # found by the bad-call fuzzer (tests/fuzzbad.py)
    "index_add_source_dtype": lambda d: (
        torch.zeros(3, 4, dtype=torch.int64).to(d).index_add_(0, torch.tensor([0]).to(d), torch.ones(1, 4).to(d))
    ),
    "index_add_source_double": lambda d: torch.index_add(
        _t(3, 4).to(d), 0, torch.tensor([0]).to(d), torch.ones(1, 4, dtype=torch.float64).to(d)
    ),
    "fill_complex_into_float": lambda d: _t(3).to(d).fill_(1j),
    "fill_complex_into_long": lambda d: torch.zeros(3, dtype=torch.int64).to(d).fill_(2 + 1j),
    "setitem_complex_into_float": lambda d: _t(3).to(d).__setitem__(slice(None), 1j),
    "full_complex_float_dtype": lambda d: torch.full((2,), 1j, dtype=torch.float32, device=d),
    # numbers the meta kernels accept (session 43's probe of the last sweep's leftovers)
    "randint_like_high_below_low": lambda d: torch.randint_like(_t(3).to(d), 5, 3),
    "randint_like_high_of_zero": lambda d: torch.randint_like(_t(3).to(d), 0),
    "avg_pool2d_stride_past_int": lambda d: F.avg_pool2d(_t(1, 1, 4, 4).to(d), 2, stride=2**40),
    # PyTorch's test_foreach.py on tpu, then tests/dtype_sweep.py with complex dtypes (Note [Complex kernel checks])
    "sub_bool_number": lambda d: torch.sub(torch.ones(3, dtype=torch.bool).to(d), True),
    "rsub_bool_number": lambda d: True - torch.ones(3, dtype=torch.bool).to(d),
    "foreach_sub_bool_number": lambda d: torch._foreach_sub([torch.ones(3, dtype=torch.bool).to(d)], True),
    "maximum_complex": lambda d: torch.maximum(_c(3).to(d), _c(3).to(d)),
    "fmin_complex": lambda d: torch.fmin(_c(3).to(d), _c(3).to(d)),
    "max_dim_complex": lambda d: torch.max(_c(2, 3).to(d), 1),
    "argmax_complex": lambda d: torch.argmax(_c(3).to(d)),
    "sign_complex": lambda d: torch.sign(_c(3).to(d)),
    "foreach_sign_complex": lambda d: torch._foreach_sign([_c(3).to(d)]),
    # CPU's foreach loop skips the element op's complex check (Note [Foreach errors of complex lists])
    "foreach_maximum_complex": lambda d: torch._foreach_maximum([_c(3).to(d)], [_c(3).to(d)]),
    "foreach_minimum_complex_in_place": lambda d: torch._foreach_minimum_(
        [_c(2).to(d), _c(3).to(d)], [_c(2).to(d), _c(3).to(d)]
    ),
    "lgamma_complex": lambda d: torch.lgamma(_c(3).to(d)),
    "lt_complex": lambda d: _c(3).to(d) < _c(3).to(d),
    "mse_loss_complex": lambda d: F.mse_loss(_c(3).to(d), _c(3).to(d)),
    "histc_complex": lambda d: torch.histc(_c(3).to(d)),
    "sort_complex": lambda d: torch.sort(_c(3).to(d)),
    "group_norm_complex": lambda d: F.group_norm(_c(2, 4, 3).to(d), 2),
    # a complex input with real parameters: the mixed dtype check comes first
    "group_norm_complex_real_weight": lambda d: F.group_norm(_c(2, 4, 3).to(d), 2, _t(4).to(d), _t(4).to(d)),
    # parameters of another dtype than the input: only a half input with float parameters is taken
    "group_norm_bf16_weight": lambda d: F.group_norm(_t(2, 4, 3).to(d), 2, _t(4, dtype=torch.bfloat16).to(d)),
    "layer_norm_float64_float_weight": lambda d: F.layer_norm(_t(2, 3, dtype=torch.float64).to(d), (3,), _t(3).to(d)),
    "batch_norm_half_weight": lambda d: F.batch_norm(
        _t(2, 4, 3).to(d), _t(4).to(d), _t(4).abs().to(d), _t(4, dtype=torch.float16).to(d)
    ),
    "batch_norm_training_bf16_statistics": lambda d: F.batch_norm(
        _t(2, 4, 3, dtype=torch.float16).to(d), _t(4, dtype=torch.bfloat16).to(d), _t(4).abs().to(d), training=True
    ),
    "batch_norm_running_mean_alone": lambda d: F.batch_norm(_t(2, 4, 3).to(d), _t(4).to(d), None, training=True),
    "native_batch_norm_legit_bf16_weight": lambda d: torch.ops.aten._native_batch_norm_legit(
        _t(2, 4, 3).to(d), _t(4, dtype=torch.bfloat16).to(d), None, _t(4).to(d), _t(4).abs().to(d), True, 0.1, 1e-5
    ),
    "embedding_bag_float64_per_sample_weights": lambda d: F.embedding_bag(
        torch.tensor([0, 2, 1]).to(d),
        _t(3, 2).to(d),
        torch.tensor([0, 1]).to(d),
        mode="sum",
        per_sample_weights=_t(3, dtype=torch.float64).to(d),
    ),
    "histogramdd_float64_bins": lambda d: torch.histogramdd(
        _t(5, 2).to(d), [torch.linspace(-1, 1, 3, dtype=torch.float64).to(d)] * 2
    ),
    # an empty operand: the kernel check runs on the real shapes first (gather takes an empty index of any dtype)
    "mm_empty_float64": lambda d: torch.mm(_t(0, 5).to(d), _t(5, 4, dtype=torch.float64).to(d)),
    # factories in dtypes CPU's kernels lack (their meta kernels take any)
    "arange_bool": lambda d: torch.arange(4, dtype=torch.bool, device=d),
    "arange_complex": lambda d: torch.arange(0, 4, 2, dtype=torch.complex64, device=d),
    "arange_uint32": lambda d: torch.arange(0.5, 4, dtype=torch.uint32, device=d),
    "kaiser_window_complex": lambda d: torch.kaiser_window(4, dtype=torch.complex128, device=d),
    "geometric_uint16": lambda d: torch.zeros(3, dtype=torch.uint16, device=d).geometric_(0.5),
    # CPU computes few ops in uint16-64 and float8 (Note [Complex kernel checks]); one-element stand-ins took
    # fast paths (flip, norm), so the check runs on the real shapes first
    "neg_uint16": lambda d: torch.neg(torch.arange(4, device=d).to(torch.uint16)),
    "add_uint32": lambda d: torch.arange(4, device=d).to(torch.uint32) + 1,
    "lt_uint64": lambda d: torch.arange(4, device=d).to(torch.uint64) < 2,
    "histc_uint16": lambda d: torch.histc(torch.arange(4, device=d).to(torch.uint16), 3),
    "flip_float8": lambda d: torch.flip(_t(4).to(torch.float8_e4m3fn).to(d), (0,)),
    "vector_norm_float8": lambda d: torch.linalg.vector_norm(_t(4).to(torch.float8_e5m2).to(d)),
    "std_float8": lambda d: torch.std(_t(4).to(torch.float8_e4m3fn).to(d)),
    "instance_norm_float64_weight": lambda d: F.instance_norm(
        _t(2, 4, 3).to(d), weight=_t(4, dtype=torch.float64).to(d)
    ),
    "topk_complex": lambda d: torch.topk(_c(3).to(d), 2),
    "randint_like_complex": lambda d: torch.randint_like(_c(3).to(d), 5),
    "foreach_addcmul_scalars_not_contiguous": lambda d: torch._foreach_addcmul(
        [_t(2).to(d)] * 2, [_t(2).to(d)] * 2, [_t(2).to(d)] * 2, torch.ones(4).to(d)[::2]
    ),
}


def _c(*shape):
    return torch.complex(_t(*shape), _t(*shape))


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


def _assert_same_error(fn):
    cpu_type, cpu_message = _outcome(fn, "cpu")
    assert cpu_type is not None, "the case must fail on CPU"
    tpu_type, tpu_message = _outcome(fn, "tpu")
    assert tpu_type is cpu_type, (tpu_type, tpu_message, cpu_message)
    assert re.sub(r"(?<![a-z])tpu(:0)?(?![a-z])", "cpu", tpu_message) == cpu_message, (tpu_message, cpu_message)


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_error_as_cpu(name):
    _assert_same_error(CASES[name])


@pytest.mark.parametrize("name", sorted(AT_CALL_CASES))
def test_error_at_the_call(name, eager_mode):
    """Raised when the op is recorded: defer mode reads nothing, so an error
    left to the program's run (or a wrapped dim) would not show."""
    with mode(eager_mode):
        _assert_same_error(AT_CALL_CASES[name])


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64], ids=str)
def test_what_cpu_computes_in_wide_unsigned_dtypes_computes(dtype, eager_mode):
    """The kernel check of every uint16-64 call lets through what CPU's kernels take."""

    def ops(x):
        return [x * 2, x & 3, torch.cat([x, x]), x[torch.tensor([0, 2], device=x.device)], x.sum(), x == 1, x.float()]

    with no_fallback():
        run_both(ops, torch.arange(6).to(dtype), mode_name=eager_mode)


def test_table_size():
    assert len(CASES) >= 40


def test_kernel_check_leaves_cpu_generator():
    """A random op's kernel check draws on CPU stand-ins; the CPU generator
    must not see it (Note [Kernel checks])."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    torch.bernoulli(torch.full((3, 5, 7), 0.5, device="tpu"))  # a new call signature: its plan checks the kernel
    torch.rand(1, 2, 3, device="tpu").uniform_(0.25, 0.5)
    assert torch.equal(torch.rand(3), expected)


def test_dim_check_once_per_call_signature(monkeypatch):
    """The dim check runs the CPU kernel on stand-ins when a call signature is
    first planned, never again for it (Note [Dim checks]): not on the hot path."""
    from lazytpu.frontend.checks import kernel_checks

    runs = []
    cpu_error = kernel_checks.cpu_error
    monkeypatch.setattr(kernel_checks, "cpu_error", lambda *a: runs.append(a) or cpu_error(*a))
    x = _t(2, 7, 3).to("tpu")
    x.sort(dim=1, descending=True)
    first = len(runs)
    for _ in range(3):
        x.sort(dim=1, descending=True)
    assert first and len(runs) == first


def _backward_of_in_place(activation, number):
    def run(d):
        x = _t(4).to(d).requires_grad_()
        y = x * 1
        activation(y, number, inplace=True)
        y.sum().backward()

    return run


def _pair(x):
    return x.reshape(2, 2)


# A call torch's CPU kernel refuses for a number's value, after a valid call of
# the same signature (a lifted number's value is not part of it): the check ran
# once per signature, and the second call computed (an in-place leaky_relu's
# backward with a negative slope gave a gradient of ones); celu's alpha 0 and
# smooth_l1_loss's negative beta were never checked; multinomial's n_sample
# failed at the sync, taking the ops recorded beside it.
NUMBER_CASES = {
    "histc_min_above_max": lambda d, v: torch.histc(_t(4).to(d), 2, *((0.0, 2.0) if v else (3.0, 1.0))),
    "cdist_negative_p": lambda d, v: torch.cdist(_pair(_t(4).to(d)), _pair(_t(4).to(d)), 1.0 if v else -1.0),
    "renorm_negative_maxnorm": lambda d, v: torch.renorm(_pair(_t(4).to(d)), 2, 0, 1.0 if v else -1.0),
    "renorm_negative_p": lambda d, v: torch.renorm(_pair(_t(4).to(d)), 2.0 if v else -1.0, 0, 1.0),
    "leaky_relu_in_place_negative_slope": lambda d, v: _backward_of_in_place(F.leaky_relu, 0.1 if v else -0.1)(d),
    "elu_in_place_negative_alpha": lambda d, v: _backward_of_in_place(F.elu, 1.0 if v else -1.0)(d),
    "celu_zero_alpha": lambda d, v: F.celu(_t(4).to(d), 1.0 if v else 0.0),
    "smooth_l1_negative_beta": lambda d, v: F.smooth_l1_loss(_t(4).to(d), _t(4).to(d), beta=1.0 if v else -1.0),
    "multinomial_too_many": lambda d, v: torch.multinomial(torch.ones(4).to(d), 2 if v else 6),
    "multinomial_none": lambda d, v: torch.multinomial(torch.ones(4).to(d), 2 if v else 0),
    "huber_negative_delta": lambda d, v: F.huber_loss(_t(4).to(d), _t(4).to(d), delta=8.7 if v else -1.5),
    "softshrink_negative_lambda": lambda d, v: F.softshrink(_t(4).to(d), 0.0 if v else -1.5),
    "allclose_negative_rtol": lambda d, v: torch.allclose(_t(4).to(d), _t(4).to(d), rtol=1.0 if v else -1.5),
    "histogram_no_bins": lambda d, v: torch.histogram(_t(4).to(d), 2 if v else 0),
    # sizes the meta kernels do not check: the lowering clamped the index (row 1 written for 7) or wrote a part
    "select_scatter_index_past_the_end": lambda d, v: torch.select_scatter(
        _t(3, 4).to(d), _t(4).to(d), 0, 1 if v else 7
    ),
    "slice_scatter_negative_step": lambda d, v: torch.slice_scatter(
        _t(3, 4).to(d), _t(3, 4).to(d), 0, 0, 3, 1 if v else -1
    ),
    "slice_scatter_source_too_large": lambda d, v: torch.slice_scatter(
        _t(3, 4).to(d), _t(3, 4).to(d), 0, 0, 3 if v else 1
    ),
    "diagonal_scatter_source_too_large": lambda d, v: torch.diagonal_scatter(
        _t(3, 4).to(d), _t(3).to(d), 0 if v else 2
    ),
}


@pytest.mark.parametrize("name", sorted(NUMBER_CASES))
def test_a_number_is_checked_at_every_call(name, eager_mode):
    case = NUMBER_CASES[name]
    with mode(eager_mode):
        case("tpu", True)
        _assert_same_error(lambda d: case(d, False))
        after = torch.arange(3.0, device="tpu") * 2  # recorded after the refused call: computed
        assert after.tolist() == [0.0, 2.0, 4.0]


# Calls that mix a CPU tensor into a tpu op where torch's own checks refuse it
# (as on CUDA); the first two raised AttributeError from inside lazytpu.
MIXED_DEVICE_CASES = {
    "in_place_into_a_cpu_scalar": (
        lambda: torch.tensor(1.0).mul_(torch.tensor(2.0, device="tpu")),
        "Expected all tensors to be on the same device, but found at least two devices, tpu:0 and cpu!",
    ),
    "set_to_a_cpu_tensor": (
        lambda: torch.zeros(3, device="tpu").set_(torch.empty(2)),
        'Attempted to set the storage of a tensor on device "tpu:0" to a storage on different device "cpu".  '
        "This is no longer allowed; the devices must match.",
    ),
    "copy_that_does_not_broadcast": (  # torch's words, as CPU's copy_ (it was broadcast_shapes')
        lambda: torch.zeros(2, 3, device="tpu").copy_(torch.randn(2)),
        "The size of tensor a (3) must match the size of tensor b (2) at non-singleton dimension 1",
    ),
    "copy_into_a_smaller_target": (
        lambda: torch.zeros(2, 1, device="tpu").copy_(torch.randn(2, 3, device="tpu")),
        "output with shape [2, 1] doesn't match the broadcast shape [2, 3]",
    ),
}


@pytest.mark.parametrize("name", sorted(MIXED_DEVICE_CASES))
def test_mixed_devices_raise_torchs_error(name):
    call, message = MIXED_DEVICE_CASES[name]
    with pytest.raises(RuntimeError) as raised:
        call()
    assert str(raised.value) == message
