"""``torch.autocast("tpu")``: torch's autocast policy on the PrivateUse1 device.

Note [Autocast on PrivateUse1]: ``torch.autocast("tpu", dtype=...)`` accepts
the device because ``torch.tpu.get_amp_supported_dtype()`` exists; enabling it
adds the AutocastPrivateUse1 key to every ``tpu`` op. torch registers no
kernels for that key (not even a fallthrough), so without this module every
op under autocast fails with "Could not run ... 'Autocasttpu' backend". This
module registers a fallthrough for all ops and, for the ops of torch's CUDA
autocast lists (``aten/src/ATen/autocast_mode.h``), kernels that cast their
floating ``tpu`` arguments and re-dispatch below autocast:

- ``lower``: matmuls, linear, convolutions, attention -> the autocast dtype;
- ``fp32``: reductions prone to overflow, norms, losses, pointwise ``exp``/``log``... -> float32,
  and, from torch's CPU list, the ops with no low-precision kernel (FFTs, solvers and
  decompositions, ``quantile``, ``polar``...), which CUDA's autocast leaves to raise;
- ``fp32_set_opt_dtype``: ``sum``/``softmax``/``cumsum``...: computed with ``dtype=float32``
  unless the call gives a dtype;
- ``promote``: ops mixing inputs (``cat``, ``addcmul``, ...) -> the widest input dtype;
- ``binary_cross_entropy`` is refused with torch's message, as CUDA's autocast bans it.

As in torch, float64 tensors and tensors on other devices are never cast.
Casts happen above autograd, so backward sees the cast inputs and gradients
flow back to float32 parameters through the casts.
"""

from __future__ import annotations

import torch

_KEY = torch._C.DispatchKey.AutocastPrivateUse1
_DEVICE = "tpu"

# Op names, or name.overload; a bare name covers every functional overload.
_LOWER = """
    _convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d.input conv_transpose3d.input
    convolution prelu addmm addmv addr matmul einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul
    linalg_multi_dot _thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell
    scaled_dot_product_attention
""".split()
_FP32 = """
    acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow.Tensor_Scalar
    pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm group_norm frobenius_norm.dim nuclear_norm
    cosine_similarity poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss
    smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss
    triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp
    upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d _upsample_nearest_exact2d upsample_nearest3d
    _upsample_nearest_exact3d upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d
    upsample_bicubic2d _upsample_bicubic2d_aa norm rms_norm
    cross_entropy_loss
""".split()  # cross_entropy_loss: from torch's CPU list (CUDA runs its log_softmax in the input dtype)
# Ops of torch's CPU fp32 list that have no float16/bfloat16 kernel on tpu (nor on CUDA): in float32 as on CPU,
# where CUDA's autocast would raise (a bf16 activation reaching an FFT layer, a solver, quantile).
_FP32 += """
    fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn fft_rfft fft_irfft fft_rfft2 fft_irfft2 fft_rfftn
    fft_irfftn fft_hfft fft_ihfft stft polar view_as_complex quantile nanquantile avg_pool3d cholesky
    cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse geqrf qr svd triangular_solve linalg_cond
    linalg_matrix_rank linalg_solve linalg_cholesky linalg_cholesky_ex linalg_svd linalg_svdvals linalg_eig
    linalg_eigvals linalg_eigh linalg_eigvalsh linalg_inv linalg_inv_ex linalg_householder_product linalg_tensorinv
    linalg_tensorsolve linalg_lstsq linalg_qr
""".split()
_FP32_SET_OPT_DTYPE = "prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum".split()
_PROMOTE = """
    addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add cat stack index_copy
""".split()


def _eligible(x) -> bool:
    return (
        isinstance(x, torch.Tensor) and x.is_floating_point() and x.device.type == _DEVICE and x.dtype != torch.float64
    )


def _cast(x, dtype):
    if _eligible(x) and x.dtype != dtype:
        return x.to(dtype)
    if isinstance(x, (list, tuple)) and any(isinstance(y, torch.Tensor) for y in x):
        return type(x)(_cast(y, dtype) for y in x)
    return x


def _tensors(args):
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (y for y in a if isinstance(y, torch.Tensor))


def _cast_all(args, kwargs, dtype):
    return [_cast(a, dtype) for a in args], {k: _cast(v, dtype) for k, v in kwargs.items()}


def _lower(op, args, kwargs):
    return _cast_all(args, kwargs, torch.get_autocast_dtype(_DEVICE))


def _fp32(op, args, kwargs):
    return _cast_all(args, kwargs, torch.float32)


def _fp32_set_opt_dtype(op, args, kwargs):
    # Only when the first argument is eligible: an explicit dtype could change
    # torch's own promotion otherwise. A dtype the caller gave is kept.
    args, kwargs = list(args), dict(kwargs)
    names = [a.name for a in op._schema.arguments]
    if not (args and _eligible(args[0]) and "dtype" in names):
        return args, kwargs
    i = names.index("dtype")
    if i < len(args):
        if args[i] is None:
            args[i] = torch.float32
    elif kwargs.get("dtype") is None:
        kwargs["dtype"] = torch.float32
    return args, kwargs


def _promote(op, args, kwargs):
    widest = torch.get_autocast_dtype(_DEVICE)
    for t in _tensors(list(args) + list(kwargs.values())):
        if _eligible(t):
            widest = torch.promote_types(widest, t.dtype)
    return _cast_all(args, kwargs, widest)


def _kernel(op, policy):
    def autocast_kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_KEY)):
            args, kwargs = policy(op, args, kwargs)
            return op(*args, **kwargs)

    autocast_kernel.__qualname__ = f"autocast_{policy.__name__.lstrip('_')}[{op}]"
    return autocast_kernel


def _overloads(spec: str) -> list:
    """The aten overloads a policy entry names (none if this torch lacks the op)."""
    name, _, overload = spec.partition(".")
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return []
    names = [overload] if overload else [n for n in packet.overloads() if "out" not in n]
    return [getattr(packet, n) for n in names if n in packet.overloads()]


POLICIES = {
    "lower": (_LOWER, _lower),
    "fp32": (_FP32, _fp32),
    "fp32_set_opt_dtype": (_FP32_SET_OPT_DTYPE, _fp32_set_opt_dtype),
    "promote": (_PROMOTE, _promote),
}


def policy_of(op) -> str | None:
    """The autocast policy name of an aten overload on ``tpu`` (None: runs as is)."""
    for name, (specs, _) in POLICIES.items():
        if any(op in _overloads(spec) for spec in specs):
            return name
    return None


def _binary_cross_entropy_banned(*args, **kwargs):
    """torch's kernel for the one op its autocast refuses (``binary_cross_entropy_banned``), its message."""
    raise RuntimeError(
        "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
        "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
        "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
        "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
        "safe to autocast."
    )


# Note [torchvision under autocast]: torchvision's detection ops have C++ kernels for CPU and
# CUDA only (on tpu they run on CPU, Note [Resolution order] in frontend/dispatch) and autocast
# kernels for CUDA, CPU and XPU, which run them in float32: a bfloat16 feature map reaching
# ``roi_align`` under ``torch.autocast("tpu")`` raised from its CPU kernel instead. The same
# kernels for tpu, as torchvision's CUDA ones: float32 inputs, outputs back in the first input's
# dtype (``nms``'s indices as they are). They are registered by name, before torchvision defines
# its ops if it is imported after lazytpu: the dispatcher keeps a kernel for an op defined later.
_TORCHVISION_FP32 = {  # op: whether its outputs go back to the first input's dtype
    "nms": False,
    "roi_align": True,
    "roi_pool": True,
    "ps_roi_align": True,
    "ps_roi_pool": True,
    "deform_conv2d": True,
}


def _torchvision_kernel(name: str, cast_back: bool):
    def autocast_kernel(*args):
        op = getattr(torch.ops.torchvision, name).default
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_KEY)):
            out = op(*(_cast(a, torch.float32) for a in args))
        if not cast_back:
            return out
        dtype = args[0].dtype
        return tuple(t.to(dtype) for t in out) if isinstance(out, tuple) else out.to(dtype)

    autocast_kernel.__qualname__ = f"autocast_fp32[torchvision.{name}]"
    return autocast_kernel


def register() -> list:
    """Install the fallthrough and the policy kernels; returns the libraries to keep alive."""
    fallthrough = torch.library.Library("_", "IMPL")
    fallthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    kernels = torch.library.Library("aten", "IMPL")
    for specs, policy in POLICIES.values():
        for spec in specs:
            for op in _overloads(spec):
                kernels.impl(op, _kernel(op, policy), "AutocastPrivateUse1")
    kernels.impl("binary_cross_entropy", _binary_cross_entropy_banned, "AutocastPrivateUse1")
    # torch.library.Library refuses an op not defined yet; the dispatcher's own library does not
    torchvision = torch._C._dispatch_library("IMPL", "torchvision", "", __file__, 0)
    for name, cast_back in _TORCHVISION_FP32.items():
        torchvision.impl(name, "AutocastPrivateUse1", _torchvision_kernel(name, cast_back), False)
    return [fallthrough, kernels, torchvision]
