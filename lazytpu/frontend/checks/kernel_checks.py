"""Kernel checks: torch's errors for calls its CPU kernels reject and its meta kernels accept (Note [Kernel checks])."""

from __future__ import annotations

import functools
import math
import re
import warnings

import torch

from lazytpu.frontend.checks.probe import cpu_error
from lazytpu.ir import Scalar
from lazytpu.ir.source import user_stacklevel
from lazytpu.ir.template import fill

# Errors of CPU kernels that meta kernels do not raise, and that do not
# depend on sizes (Note [Kernel checks]).
_KERNEL_ERRORS = re.compile(
    r"not (yet )?implemented for|same dtype|expected scalar type|Dimension out of range|destination dtypes match"
    r"|not supported for complex|p has to be greater than or equal to 1|alpha must not be a floating point"
    r"|only support floating point|Expected a floating point|handle types other than|only supports floating-point"
    r"|does not support bool|Boolean inputs not supported|may not be a boolean tensor"
    r"|with a bool tensor is not supported|Expected both inputs to be Half, Float or Double"
    r"|can't be cast to the desired output type|Found dtype \w+ but expected \w+"
    r"|Integer division with addcdiv|doesn't support tensors of type|(from|to - 1) is out of bounds for"
    r"|sorter must be a tensor of long dtype"  # searchsorted's sorter
    r"|boundaries tensor must be 1 dimension"  # bucketize
    r"|only accept 1D vector as repeat"  # repeat_interleave
    r"|boundaries tensor should have positive dimension"  # searchsorted
    r"|Expected object of scalar type"  # complex, polar: both parts of one dtype
    r"|backward calculation is triggered with a negative slope|bins must be > 0"
    r"|reduce argument must be either|Expected reduce to be one of"  # segment_reduce, scatter_reduce, index_reduce
    # index, target and mask dtypes of the indexing ops (_INDEX_CHECKED)
    r"|Expected dtype int(32|64)\S* (or int64 )?for index|Expected a long tensor for index"
    r"|expected target dtype to be|only supports boolean masks|Converting complex Scalar to non-complex"
    r"|source tensor shape must match self tensor shape|and source \(\w+\) must have the same scalar type"
    r"|value cannot be converted to type int without overflow"  # a pooling stride or padding past int
    r"|does not support complex|is not intended to support complex|with two bool tensors is not supported"
    r"|handles only integral"  # random bounds of a complex tensor
    r"|mixed dtype \(CPU\)"  # a norm's parameters of another dtype than its input (CUDA refuses them too)
    r"|must either both be None or neither be None"  # a batch norm's running statistics
    r"|to have the same type as tensor for argument|bins tensors should have the same dtype"
    r"|to have one of the following scalar types|Unsupported dtype|Promotion for [\w ,]+ (T|t)ypes is not supported"
)

# Errors that depend on the sizes: they decide only where the stand-ins have
# the real shapes (cummax of a 0-d tensor along dim 1), not where an empty
# stand-in made them (kthvalue(x, 2) of a 1-d x).
_SIZE_ERRORS = re.compile(
    r"Expected reduction dim|out of range for tensor of size|slice step must be positive"
    r"|expected src to have a size equal to the slice of self"
)

# Indexing ops whose CPU kernels check their index (or mask) dtype, and a
# complex fill value, where meta kernels do not.
_INDEX_CHECKED = frozenset({"index_add", "index_copy", "index_fill", "index_select", "put", "masked_scatter"})


# Op families whose CPU kernels check what meta kernels skip, and that are
# safe to call on one-element and zero-size inputs (``_CHECKED``).
_KERNEL_CHECKED = frozenset(
    {
        "_softmax",
        "_log_softmax",
        "_softmax_backward_data",
        "round",
        "cholesky",
        "_linalg_eigh",
        "linalg_lu_factor_ex",
        "linalg_lu",
        "abs",
        "ceil",
        "floor",
        "trunc",
        "pow",
        "remainder",
        "fmod",
        "div",
        "relu",
        "hardswish",
        "hardsigmoid",
        "leaky_relu_backward",  # in-place with a negative slope: the backward refuses (elu_ and rrelu_ too)
        "elu_backward",
        "log_sigmoid_forward",
        "smooth_l1_loss",
        "multi_margin_loss",
        "median",
        "nanmedian",
        "trace",
        "addbmm",
        "bucketize",
        "searchsorted",
        "repeat_interleave",
        "index_reduce",
        "scatter_reduce",
        "complex",
        "polar",
        "_cdist_forward",
        "_trilinear",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_fused_attention_overrideable",
        "_fft_r2c",
        "_histogramdd_bin_edges",
        "_histogramdd_from_bin_cts",
        "segment_reduce",
        # batch norm: its parameters and statistics of one size, the input's channels (the kernel trusts them)
        "native_batch_norm",
        "_native_batch_norm_legit",  # the forms of export and AOT graphs
        "_native_batch_norm_legit_no_training",
        "_native_batch_norm_legit_functional",
        "_batch_norm_with_update",
        "_embedding_bag",  # per-sample weights of another dtype than the weight (_CPU_KERNELS)
        "_embedding_bag_forward_only",
        # random ops: their draws on the stand-ins leave the CPU generator as it was
        "uniform",
        "bernoulli",
        "multinomial",
        "rrelu_with_noise_functional",
        "randint_like",
        "normal",
        "poisson",
        "binomial",
        "_standard_gamma",
        "_sample_dirichlet",
        "_standard_gamma_grad",
        "_dirichlet_grad",
        "geometric",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "bitwise_not",
        "bitwise_left_shift",
        "bitwise_right_shift",
        "__and__",
        "__or__",
        "__xor__",
        "__lshift__",
        "__rshift__",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "mv",
        "addmv",
        "dot",
        "vdot",
        "cumsum",
        "cumprod",
        "logcumsumexp",
        "max",
        "min",
        "amax",
        "amin",
        "argmax",
        "argmin",
        "aminmax",
        "index_put",
        "clamp",
        "clamp_min",
        "clamp_max",
        "threshold",
        "add",  # a float alpha with bool tensors (meta checks it for the other integer dtypes only)
        "sub",
        "rsub",
        "addcmul",
        "addcdiv",
        "lerp",
        "var",
        "std",
        "histc",
        "gelu",
        "silu",
        "softplus",
        "glu",
        "nll_loss_forward",
        "nll_loss2d_forward",
        "huber_loss",
        "binary_cross_entropy",
        "soft_margin_loss",
        # linear algebra (LAPACK kernels): floating and complex dtypes only
        "linalg_cholesky_ex",
        "cholesky_solve",
        "cholesky_inverse",
        "linalg_solve_triangular",
        "triangular_solve",
        "linalg_lstsq",
        "linalg_householder_product",
        "geqrf",
        "ormqr",
        "linalg_qr",
        "_linalg_svd",
        "linalg_eig",
        "linalg_ldl_factor_ex",
        "linalg_ldl_solve",
        "linalg_lu_solve",
        "_linalg_solve_ex",
        # pointwise special functions (lowering/special.py, pointwise_ext.py): dtypes the CPU kernels lack
        "frac",
        "mish",
        "celu",
        "hardshrink",
        "hypot",
        "nextafter",
        "heaviside",
        "logaddexp",
        "logaddexp2",
        "igamma",
        "igammac",
        "gcd",
        "lcm",
        "mvlgamma",
        "special_zeta",
        "special_erfcx",
        "special_log_ndtr",
        "special_ndtri",
        "special_airy_ai",
        "special_bessel_j0",
        "special_bessel_j1",
        "special_bessel_y0",
        "special_bessel_y1",
        "special_modified_bessel_i0",
        "special_modified_bessel_i1",
        "special_modified_bessel_k0",
        "special_modified_bessel_k1",
        "special_scaled_modified_bessel_k0",
        "special_scaled_modified_bessel_k1",
        "special_spherical_bessel_j0",
        *(f"special_{kind}_polynomial_{p}" for kind in ("chebyshev", "shifted_chebyshev") for p in "tuvw"),
        "special_hermite_polynomial_h",
        "special_hermite_polynomial_he",
        "special_laguerre_polynomial_l",
        "special_legendre_polynomial_p",
    }
)


# Note [Dim checks]: some meta kernels accept a dim out of the input's range
# that the CPU kernel refuses (``sort(x, dim=2)`` of a 2-D tensor), and the
# lowering rules take dims modulo the rank (``dim % x.ndim``): the call would
# compute along another axis instead of raising. These families are checked
# on one-element stand-ins as ``_KERNEL_CHECKED`` ones are (once per call
# signature: the dim is static, part of the plan key), so torch's
# ``Dimension out of range`` (or ``cummax()``'s message for a scalar) is raised
# at the call. ``make arg-sweep`` (tests/arg_sweep.py) lists the calls still
# missing.
_DIM_CHECKED = frozenset(
    {
        "sort",  # both overloads; argsort and msort decompose to it
        "cummax",  # a scalar takes dim -1 or 0 only
        "cummin",
        # index_select of a scalar too: checked as one of _INDEX_CHECKED
    }
)

# Families whose meta kernels skip the size checks of their CPU kernels (an
# index past the end, a source of another size than the slice it fills: the
# lowering clamped the index, or wrote a part), checked on stand-ins of the
# real shapes, as far as ``_SHAPED_LIMIT``.
_CHECKED_ON_REAL_SHAPES = frozenset(
    # ``histogram``: a bins tensor of one element is no bin ("bins must be > 0"); the edges must keep their count
    {"select_scatter", "slice_scatter", "diagonal_scatter", "histogram", "_histogramdd_from_bin_tensors"}
)


def _attention_on_cpu(query, key, value, attn_bias=None, *args, scale=None, **kwargs):
    return torch.ops.aten._scaled_dot_product_attention_math(query, key, value, attn_bias, scale=scale)


def _group_norm_on_cpu(x, weight, bias, n, c, hxw, group, eps):
    # the stand-in's own sizes: the kernel trusts N, C and HxW, and would read past a smaller stand-in
    return torch.ops.aten.native_group_norm(x, weight, bias, x.shape[0], x.shape[1], math.prod(x.shape[2:]), group, eps)


def _embedding_bag_dtypes(
    weight, indices, offsets, scale_grad=False, mode=0, sparse=False, per_sample_weights=None, *a
):
    # one bag of one index, whatever the stand-ins: the kernel trusts its offsets (it crashed on an empty stand-in)
    one_weight = torch.ones(1, 1, dtype=weight.dtype)
    index, offset = torch.zeros(1, dtype=indices.dtype), torch.zeros(1, dtype=offsets.dtype)
    scale = None if per_sample_weights is None else torch.ones(1, dtype=per_sample_weights.dtype)
    return torch.ops.aten._embedding_bag(one_weight, index, offset, False, mode, False, scale)


def _var_of_all(x, *args, **kwargs):
    return torch.ops.aten.var.correction(torch.ones(1, dtype=x.dtype), correction=0)  # the dtype check alone


# Ops tpu records that have no CPU kernel, checked with the kernel CPU torch
# runs in their place (``scaled_dot_product_attention``'s math kernel); and
# ops whose kernel would warn of its stand-ins, checked with a call that makes
# the same dtype check and no warning: ``std``/``var`` of a one-element
# stand-in warned "degrees of freedom is <= 0" at the user's valid call (C++
# warnings reach Python when the user's call returns, past any filter here).
_CPU_KERNELS = {
    "_scaled_dot_product_efficient_attention": _attention_on_cpu,
    "_scaled_dot_product_fused_attention_overrideable": _attention_on_cpu,
    "native_group_norm": _group_norm_on_cpu,
    "_embedding_bag": _embedding_bag_dtypes,
    "_embedding_bag_forward_only": _embedding_bag_dtypes,
    "std": _var_of_all,
    "var": _var_of_all,
}

# Families whose CPU kernels check sizes before the dtype (a pooling window
# larger than the input, a grid of the wrong shape, channels of a
# convolution) or skip the dtype check on an empty batch: their check runs on
# shaped stand-ins (``_SHAPED``).
_KERNEL_CHECKED_ON_SHAPES = frozenset(
    {
        "max_pool2d_with_indices",
        "max_pool3d_with_indices",
        "max_pool2d_with_indices_backward",
        "max_pool3d_with_indices_backward",
        "avg_pool2d",
        "avg_pool3d",
        "avg_pool2d_backward",
        "avg_pool3d_backward",
        "_adaptive_avg_pool2d",
        "_adaptive_avg_pool3d",
        "_adaptive_avg_pool2d_backward",
        "_adaptive_avg_pool3d_backward",
        "adaptive_max_pool2d",
        "adaptive_max_pool3d",
        "adaptive_max_pool2d_backward",
        "adaptive_max_pool3d_backward",
        "fractional_max_pool2d",
        "fractional_max_pool3d",
        "upsample_nearest1d",
        "upsample_nearest2d",
        "upsample_nearest3d",
        "_upsample_nearest_exact1d",
        "_upsample_nearest_exact2d",
        "_upsample_nearest_exact3d",
        "upsample_linear1d",
        "upsample_bilinear2d",
        "upsample_bicubic2d",
        "upsample_trilinear3d",
        "_upsample_bilinear2d_aa",
        "_upsample_bicubic2d_aa",
        "convolution",
        "grid_sampler_2d",
        "grid_sampler_3d",
        "max_unpool2d",
        "max_unpool3d",
        "im2col",
        "col2im",
        "reflection_pad1d",
        "reflection_pad2d",
        "reflection_pad3d",
        "replication_pad1d",
        "replication_pad2d",
        "replication_pad3d",
        "multilabel_margin_loss_forward",
        "native_layer_norm",  # a norm's parameters keep their sizes: the input's last ones, its channels
        "native_group_norm",
        "topk",
        "kthvalue",
        "linalg_cross",
    }
)

# The most elements a shaped stand-in may have (a larger call goes unchecked).
_SHAPED_LIMIT = 1 << 20


# Stand-ins: a function of the real tensors' shapes giving theirs, and the
# value of integer stand-ins (floating ones are ones: a probability, a
# matrix to factor; integer ones index: a class, a pooling index, a pivot).


def _empty(shapes):
    return [(0,) * len(s) for s in shapes]


def _as_they_are(shapes):
    return shapes


def _ones(shapes):
    return [(1,) * len(s) for s in shapes]


def _batch(size: int, first_only: bool = False):
    """The real shapes with a leading dimension of ``size``, in every tensor
    or in the first one only (a convolution's input, not its weight)."""

    def make(shapes):
        return [(size, *s[1:]) if s and not (first_only and i) else s for i, s in enumerate(shapes)]

    return make


# Tried in order until one decides (raises a kernel error, or passes with
# elements; an empty call decides only by raising, as some kernels return
# early on empty inputs): one element (0 indexes, 1 is a 1-based pivot),
# then no elements.
_CHECKED = ((_ones, 0), (_ones, 1), (_empty, 0))

# The same for kernels that check sizes first: every dimension 1 (windows of
# one, upsampling, adaptive pools); an empty batch (a window needs the real
# spatial sizes); one sample; one sample beside the other tensors as they are
# (a convolution's weight); then the real shapes (``topk``'s k must fit the
# dim before its dtype is checked), up to ``_SHAPED_LIMIT``.
_SHAPED = ((_ones, 0), (_batch(0), 0), (_batch(1), 0), (_batch(1, first_only=True), 0), (_as_they_are, 0))


def _stand_in(shape, dtype, index):
    if dtype.is_floating_point or dtype.is_complex:
        return torch.ones(shape, dtype=dtype)
    return torch.full(shape, index, dtype=dtype)


# Dtypes CPU computes few ops in (casts, copies, indexing): float8, and the
# unsigned integers past uint8 (no comparisons, no neg, no maximum).
_FEW_KERNELS = frozenset(
    {torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz}
    | {torch.uint16, torch.uint32, torch.uint64}
)

# Note [Complex kernel checks]: CPU's kernels lack complex dtypes in a long
# tail of ops (comparisons, ``maximum``, ``sign``, ``lgamma``, ``erf``, sorts,
# norms, activations, losses) whose lowerings would compute or fail in the
# program: a call with a complex operand runs the check whatever its family
# (once per call signature), as float8 and uint16-64 ones do. ``nansum`` is
# left out: CUDA's kernel sums complex values (CPU's message says "on CPU").
# The real shapes come first (as far as ``_SHAPED_LIMIT``): one-element
# stand-ins take fast paths before the dtype check (``flip`` and ``norm`` of
# one element computed in float8).
_COMPLEX_CUDA_COMPUTES = frozenset({"nansum"})


def _asks_every_op(values, family: str) -> bool:
    """Whether an operand's dtype makes every op run its kernel check (Note [Complex kernel checks])."""
    for v in values:
        if type(v) is not Scalar and (
            v.dtype in _FEW_KERNELS or v.dtype.is_complex and family not in _COMPLEX_CUDA_COMPUTES
        ):
            return True
    return False


_INTEGERS = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})  # CUDA's histc takes these

# Note [CUDA's histc]: CUDA's ``histc`` counts integer inputs (in their
# dtype), CPU's refuses them. transformers' MoE layers count the tokens of each
# expert with an int32 ``histc`` on every device but CPU and MPS (CUDA's
# deterministic kernel takes integers only), so tpu takes them as CUDA does.


# Factories whose CPU kernels lack dtypes that meta kernels take (``torch.arange(4, dtype=torch.bool)``):
# the same factory's smallest call in the call's dtype.
_FACTORY_PROBES = {
    "arange": lambda dtype: torch.arange(1, dtype=dtype),
    "kaiser_window": lambda dtype: torch.kaiser_window(2, dtype=dtype),
}


def _check_factory_dtype(family, template, values) -> None:
    dtype = fill(template, values)[1].get("dtype")
    if dtype is None:
        return  # the default dtype, or one inferred from the numbers: CPU's kernels take those
    try:
        _FACTORY_PROBES[family](dtype)
    except NotImplementedError as exc:
        raise NotImplementedError(str(exc).replace("_cpu", "_tpu")) from None


def check_kernel_dtypes(func, template, values) -> None:
    """Note [Kernel checks]: meta kernels skip some checks real kernels make
    (dtype support, mixed dtypes in mm, dim wrapping in softmax). Once per call
    signature (plan time; a decomposed op at ``record.check_with_meta``),
    the op runs on CPU on stand-ins: small tensors of the same dtypes and
    ranks, of ones or zeros, never the real data (the check reads nothing
    pending, and costs nothing per call). If that raises one of those
    size-independent errors, it is raised now, as the backend's
    (``"bitwise_and_tpu" not implemented for 'Float'``). The stand-ins are
    tried in order until one decides: one element per tensor, then no
    elements (``_CHECKED``); kernels that check sizes before the dtype
    (pooling, upsampling, convolution, grid_sample) get real shapes with a
    batch of 0 or 1 after one element fails their size checks (``_SHAPED``).
    The real shapes go first (as far as ``_SHAPED_LIMIT``) where an operand is
    empty or of a dtype CPU computes few ops in (Note [Complex kernel checks]).
    Factories check their dtype with their smallest call (``_FACTORY_PROBES``).
    Random ops draw on their stand-ins (the probe restores the CPU generator).
    The same stand-ins check the dims of ``_DIM_CHECKED`` families
    (Note [Dim checks]) and the index dtypes of ``_INDEX_CHECKED`` ones.
    ``make dtype-sweep`` lists the ops still missing (``tests/dtype_sweep.py``):
    403 cases before the one-element and shaped stand-ins, none after."""

    family = func._schema.name.split("::")[-1]
    if family in _FACTORY_PROBES:
        return _check_factory_dtype(family, template, values)
    if family == "histc" and values[0].dtype in _INTEGERS:
        return  # Note [CUDA's histc]
    if family in _KERNEL_CHECKED or family in _INDEX_CHECKED or family in _DIM_CHECKED:
        stand_ins = _CHECKED
    elif family in _KERNEL_CHECKED_ON_SHAPES:
        stand_ins = _SHAPED
    elif family in _CHECKED_ON_REAL_SHAPES:
        stand_ins = ((_as_they_are, 0),)
    elif _asks_every_op(values, family):  # Note [Complex kernel checks]
        stand_ins = _CHECKED  # after the real shapes (below)
    else:
        return  # some CPU kernels crash (SIGFPE) on zero-size inputs: only known-safe families run
    tensors = [v for v in values if type(v) is not Scalar]
    if not tensors:
        return
    shapes = [tuple(v.shape) for v in tensors]
    exact = all(0 in s for s in shapes)  # empty inputs: the real call costs nothing, and decides
    if exact:
        stand_ins = ((_as_they_are, 0),)
    elif stand_ins[0][0] is not _as_they_are and (any(0 in s for s in shapes) or _asks_every_op(values, family)):
        # kernels skip some checks of an empty operand (gather's index dtype), and take fast paths for one
        # element (Note [Complex kernel checks]): the real shapes first
        stand_ins = ((_as_they_are, 0), *stand_ins)
    kernel = _CPU_KERNELS.get(family, func)
    for make, index in stand_ins:
        made = make(shapes)
        count = sum(math.prod(s) for s in made)
        if count > _SHAPED_LIMIT:
            continue
        by_id = {id(v): _stand_in(s, v.dtype, index) for v, s in zip(tensors, made, strict=True)}
        error = cpu_error(kernel, template, values, lambda v: by_id[id(v)])  # noqa: B023
        if error is not None and (
            exact or _KERNEL_ERRORS.search(error[1]) or (made == shapes and _SIZE_ERRORS.search(error[1]))
        ):
            if "shape" in error[1] and made != shapes and sum(math.prod(s) for s in shapes) <= _SHAPED_LIMIT:
                # the message quotes shapes (index_add's source): the same call on the real shapes says it
                # (only then: a kernel's warnings reach the caller once per probe)
                real = {id(v): _stand_in(s, v.dtype, index) for v, s in zip(tensors, shapes, strict=True)}
                exact_error = cpu_error(kernel, template, values, lambda v: real[id(v)])  # noqa: B023
                error = exact_error if exact_error is not None and exact_error[0] is error[0] else error
            raise error[0](error[1].replace("_cpu", "_tpu")) from None
        if error is None and count:
            return  # a call with elements that the kernel accepts: the dtypes pass


# Note [Degrees of freedom]: CPU's ``std``/``var`` kernels (and ``std_mean``,
# ``var_mean``) warn at every call whose correction is not below the
# reduction factor (input numel over output numel; 0 for an empty output):
# "degrees of freedom is <= 0". Meta kernels do not, and the dtype check's
# CPU call must not (its one-element stand-ins would warn at every valid
# call: ``_var_of_all``), so the warning is the plan's per-call check, from
# the real shapes and the call's correction (a lifted number may change).
_DOF_FAMILIES = frozenset({"std", "var", "std_mean", "var_mean"})


def degrees_of_freedom_check(func, template, values, meta_out):
    """The per-call check that warns as CPU's kernel does (Note [Degrees of freedom]), or None."""
    family = func._schema.name.split("::")[-1]
    if family not in _DOF_FAMILIES or func._overloadname != "correction":
        return None
    out = meta_out if isinstance(meta_out, torch.Tensor) else meta_out[0]
    x = next(v for v in values if type(v) is not Scalar)
    factor = 0 if out.numel() == 0 else x.numel() // out.numel()
    return functools.partial(_warn_degrees_of_freedom, family, template, factor)


def _warn_degrees_of_freedom(family, template, factor, values) -> None:
    correction = fill(template, values)[1].get("correction")
    correction = 1 if correction is None else getattr(correction, "value", correction)
    if factor - correction <= 0:
        warnings.warn(
            f"{family}(): degrees of freedom is <= 0. Correction should be strictly less than the reduction "
            "factor (input numel divided by output numel).",
            stacklevel=user_stacklevel(),
        )
