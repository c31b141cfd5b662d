"""Output metas: torch's meta kernels, run once per call signature, and the
ops torch has no meta kernel for, where the outputs' shapes and dtypes follow
from the arguments alone.

Note [Missing meta kernels]: torch registers no meta kernel for a few ops
whose output shapes do not depend on data (histograms with a given bin
count or given edges). Without one, the dispatcher could not record them
(``MetaUnavailable``: CPU fallback). A function here takes the op's
arguments as meta tensors and returns its outputs as meta tensors; it is
used only when torch's meta kernel is missing (or refuses what the CPU
kernel accepts), never instead of one that works.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from torch._prims_common import make_contiguous_strides_for

from lazytpu import _caches, _dtypes
from lazytpu.frontend import fake_quant
from lazytpu.frontend.checks.probe import run_on
from lazytpu.frontend.tensor import LazyTensor
from lazytpu.ir import Scalar

aten = torch.ops.aten


def _histogram(x, bins=100, *, range=None, weight=None, density=False):  # noqa: A002 - torch's names
    return x.new_empty(bins), x.new_empty(bins + 1)


def _histogram_edges(x, bins, *, weight=None, density=False):
    return x.new_empty(bins.shape[0] - 1), bins.new_empty(bins.shape)


def _histogramdd_edges(x, bins, *, range=None, weight=None, density=False):  # noqa: A002
    return [x.new_empty(b + 1) for b in bins]


def _histogramdd_counts(x, bins, *, range=None, weight=None, density=False):  # noqa: A002
    return x.new_empty(tuple(bins))


def _histogramdd_tensors(x, bins, *, weight=None, density=False):
    return x.new_empty(tuple(b.shape[0] - 1 for b in bins))


def _like_input(grad_output, x, *args, **kwargs):
    """A backward op's gradient for ``x``: shaped like it (its CPU kernel
    checks the data, e.g. that targets are in range)."""
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _like_first(x, *args, **kwargs):
    """An output of the first argument's dtype and the arguments' broadcast
    shape, contiguous (the kernels under ``torch.distributions``)."""
    shape = torch.broadcast_shapes(*(a.shape for a in (x, *args) if isinstance(a, torch.Tensor)))
    return torch.empty(shape, dtype=x.dtype, device=x.device)


def _grouped_mm(a, b, offs=None, bias=None, out_dtype=None):
    """CPU's kernel on zeros of the same layouts (its checks: strides aligned
    to 16 bytes, no bias, ``out_dtype`` as ``a``'s); the meta kernel is CUDA's
    (bfloat16 only). All-zero ``offs`` make every group empty: nothing is computed."""

    def zeros(m):
        return torch.empty_strided(m.shape, m.stride(), dtype=m.dtype).zero_() if isinstance(m, torch.Tensor) else m

    out = aten._grouped_mm.default(zeros(a), zeros(b), zeros(offs), zeros(bias), out_dtype)
    return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device="meta")


def _geqrf(a):
    """The Householder form (LAPACK's, column-major like torch's) and ``tau``."""
    m, n = a.shape[-2:]
    return a.new_empty(a.shape).mT.contiguous().mT, a.new_empty(a.shape[:-2] + (min(m, n),))


def _check_lstsq(a, b, driver) -> None:
    where = "torch.linalg.lstsq:"
    torch._check(a.dim() >= 2, lambda: f"{where} input must have at least 2 dimensions.")
    torch._check(b.dim() >= 1, lambda: f"{where} other must have at least 1 dimension.")
    torch._check(
        a.dtype == b.dtype,
        lambda: (
            f"{where} Expected input and other to have the same dtype, but got input's dtype "
            f"{_dtypes.type_name(a.dtype)} and other's dtype {_dtypes.type_name(b.dtype)}"
        ),
    )
    diff = a.dim() - b.dim()
    torch._check(
        0 <= diff <= 1,
        lambda: f"{where} input.dim() must be greater or equal to other.dim() and (input.dim() - other.dim()) <= 1",
    )
    vector = b.dim() == 1 or (diff == 1 and b.shape == a.shape[:-1])
    torch._check(
        a.shape[-2] == (b.shape[-1] if vector else b.shape[-2]),
        lambda: f"{where} input.size(-2) should match other.size(-{1 if vector else 2})",
    )
    torch._check(
        driver in (None, "gels", "gelsy", "gelsd", "gelss"),
        lambda: f"{where} parameter `driver` should be one of (gels, gelsy, gelsd, gelss)",
    )


def _lstsq(a, b, rcond=None, *, driver=None):
    """``linalg_lstsq``'s outputs (``BatchLinearAlgebra.cpp``): which are empty
    follows from the driver. gelsd/gelss residuals on tall input exist only
    when every matrix has full rank (data): shaped here as if so, and the
    handler (``handlers.linalg_lstsq``) empties them after reading the ranks.
    CPU's checks first (``linalg_lstsq_out``)."""
    _check_lstsq(a, b, driver)
    driver = driver or "gelsy"
    m, n = a.shape[-2:]
    vector = b.dim() == 1 or (a.dim() - 1 == b.dim() and b.shape == a.shape[:-1])
    b2 = b.unsqueeze(-1) if vector else b
    batch = torch.broadcast_shapes(a.shape[:-2], b2.shape[:-2])
    k = b2.shape[-1]
    # CPU's layout: the first n rows of a column-major buffer of max(m, n) rows, which LAPACK solved in place
    solution = a.new_empty(batch + (k, max(m, n))).mT[..., :n, :]
    solution = solution.squeeze(-1) if vector else solution
    real = a.dtype.to_real()
    residuals = a.new_empty(batch + (k,) if driver != "gelsy" and m > n else (0,), dtype=real)
    rank = a.new_empty(batch if driver != "gels" else (0,), dtype=torch.int64)
    sv = a.new_empty(batch + (min(m, n),) if driver in ("gelsd", "gelss") else (0,), dtype=real)
    return solution, residuals, rank, sv


def _check_cell(input_gates, hidden_gates, hx, input_bias, hidden_bias, factor: int) -> None:
    """The size checks of the fused RNN cells (``checkSizes`` in ``cuda/RNN.cu``)."""
    torch._check(input_gates.dim() == 2 and hidden_gates.shape == input_gates.shape, lambda: "gates must be 2-D, alike")
    if input_bias is not None:
        torch._check(input_bias.shape == (input_gates.shape[1],) == hidden_bias.shape, lambda: "bad bias sizes")
    expected = input_gates.shape[0] * input_gates.shape[1] // factor
    torch._check(hx.dim() == 2 and hx.numel() == expected, lambda: f"prev_hidden must have {expected} elements")


def _lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """``(hy, cy, workspace)``; torch's meta kernel reads ``.device`` of a missing bias."""
    _check_cell(input_gates, hidden_gates, cx, input_bias, hidden_bias, 4)
    return cx.new_empty(cx.shape), cx.new_empty(cx.shape), input_gates.new_empty(input_gates.shape)


def _gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """``(hy, workspace)``: the workspace holds five hidden-sized blocks
    (Note [Fused RNN cells] in lazytpu.lowering.rnn)."""
    _check_cell(input_gates, hidden_gates, hx, input_bias, hidden_bias, 3)
    return hx.new_empty(hx.shape), hx.new_empty((hx.shape[0], 5 * hx.shape[1]))


def _gru_cell_backward(grad_hy, workspace, has_bias):
    """The gates' gradients, ``grad_hx``, and the biases' gradients with a bias."""
    torch._check(workspace.shape == (grad_hy.shape[0], 5 * grad_hy.shape[1]), lambda: "bad workspace size")
    gates = (grad_hy.shape[0], 3 * grad_hy.shape[1])
    biases = (workspace.new_empty(gates[1:]), workspace.new_empty(gates[1:])) if has_bias else (None, None)
    return workspace.new_empty(gates), workspace.new_empty(gates), grad_hy.new_empty(grad_hy.shape), *biases


# Note [Meta shape fixes]: some meta kernels accept a call and give another shape than CPU's kernel: reduction="none"
# of multi_margin_loss with a 0-d target, and of multilabel_margin_loss with a 0-d or 1-d one, is (1,) on meta and ()
# on CPU, and ``repeat_interleave`` of no repeats is its output_size on meta and empty on CPU; or accept a call CPU's
# kernel refuses for its sizes (ctc_loss of an empty log_probs), or refuse one CPU's kernel accepts (a uint8 target of
# nll_loss, not nll_loss2d: meta's gather takes int64 only). ``FIXES`` runs torch's meta kernel (its checks) and
# returns CPU's shapes, or raises CPU's error.


def _repeat_interleave(repeats, *, output_size=None):
    """Nothing repeated gives nothing on CPU, whatever ``output_size`` says (meta: that size)."""
    out = aten.repeat_interleave.Tensor(repeats, output_size=output_size)
    return repeats.new_empty((0,)) if repeats.numel() == 0 else out


def _multi_margin_loss(x, target, p=1, margin=1, weight=None, reduction=1):
    out = aten.multi_margin_loss.default(x, target, p, margin, weight, reduction)
    return out.new_empty(()) if reduction == 0 and target.dim() == 0 else out


def _multilabel_margin_loss(x, target, reduction):
    out, is_target = aten.multilabel_margin_loss_forward.default(x, target, reduction)
    return (out.new_empty(()) if reduction == 0 and target.dim() <= 1 else out), is_target


def _byte_target(op, at: int):
    """``op`` (an nll_loss overload) given its uint8 target (argument ``at``) as int64."""

    def run(*args):
        if args[at].dtype == torch.uint8:
            args = (*args[:at], args[at].long(), *args[at + 1 :])
        return op(*args)

    return run


def _bool_power(op):
    """``op`` (``pow``/``pow_`` of a tensor and a number): a bool tensor to a bool power is CPU's copy or
    ones, in bool; the meta kernel promotes the exponent to int64 (``pow_`` refuses the cast back)."""

    def run(x, exponent):
        if x.dtype == torch.bool and type(exponent) is bool:
            return x if op is aten.pow_.Scalar else torch.empty_like(x)
        return op(x, exponent)

    return run


def _nonempty_log_probs(op):
    """``op`` (a ``_ctc_loss`` overload) with CPU's check that the meta kernel skips."""

    def checked(log_probs, *args, **kwargs):
        torch._check(log_probs.numel() > 0, lambda: "log_probs tensor must not be empty")
        return op(log_probs, *args, **kwargs)

    return checked


def _embedding_bag_dims(op):
    """``op`` (an ``_embedding_bag`` overload) with CPU's checks of its tensors' dims."""

    def checked(weight, indices, offsets, *args, **kwargs):
        for name, t, dims in (("input", indices, "1D or 2D"), ("offsets", offsets, "1D"), ("weight", weight, "2D")):
            if f"{t.dim()}D" not in dims:
                raise RuntimeError(f"{name} has to be a {dims} Tensor, but got Tensor of dimension {t.dim()}")
        return op(weight, indices, offsets, *args, **kwargs)

    return checked


def _padding_dims(op, k: int):
    """``op`` (a reflection or replication pad of ``k`` spatial dims) with CPU's check of
    its input's dims, which the meta kernel skips (it pads a 4-D input as 3-D)."""

    def checked(x, padding):
        batched = x.dim() == k + 2
        if x.dim() not in (k + 1, k + 2) or 0 in x.shape[1 if batched else 0 :]:
            raise RuntimeError(
                f"Expected {k + 1}D or {k + 2}D (batch mode) tensor with possibly 0 batch size and other non-zero "
                f"dimensions for input, but got: {list(x.shape)}"
            )
        return op(x, padding)

    return checked


def _float_statistics(op):
    """``op`` (``native_group_norm``) with CPU's float32 statistics of a half input beside float32 parameters
    (Note [CPU norm statistics]); the meta kernel gives the input's dtype."""

    def run(x, weight, bias, *args):
        out, mean, rstd = op(x, weight, bias, *args)
        parameters = {getattr(p, "dtype", None) for p in (weight, bias)}
        if x.dtype in (torch.bfloat16, torch.float16) and torch.float32 in parameters:
            return out, mean.float(), rstd.float()
        return out, mean, rstd

    return run


def _fractional_max_pool3d(x, kernel_size, output_size, samples):
    """CPU's checks of the random samples, which the meta kernel skips (2-D's has them)."""
    batch = x.shape[0] if x.dim() == 5 else 1
    torch._check(samples.shape[0] >= batch, lambda: "Expect _random_samples.size(0) no less then input batch size.")
    channels = x.shape[-4]
    torch._check(samples.shape[1] == channels, lambda: "Expect _random_samples.size(1) equals to input channel size.")
    return aten.fractional_max_pool3d.default(x, kernel_size, output_size, samples)


def _max_pool3d(x, *args):
    """CPU's layout for an unbatched input that is channels-last as a batch of one
    (``max_pool3d_with_indices_out_cpu_template``); the meta kernel's is contiguous."""
    out, indices = aten.max_pool3d_with_indices.default(x, *args)
    one = x.unsqueeze(0)
    if x.dim() == 4 and not one.is_contiguous() and one.is_contiguous(memory_format=torch.channels_last_3d):
        return _channels_last_unbatched(out), _channels_last_unbatched(indices)
    return out, indices


def _channels_last_unbatched(t):
    return t.unsqueeze(0).contiguous(memory_format=torch.channels_last_3d).squeeze(0)


# Note [Convolution layouts]: the meta kernel of ``convolution`` returns a contiguous output (meta tensors have no
# device, so it cannot choose a backend); CPU's kernels return channels-last outputs for channels-last inputs or
# weights, by rules that depend on the backend chosen for the dtype, the sizes and the batch (mkldnn or the slow
# kernels). torch's fake tensors of device ``cpu`` choose that backend as the CPU kernel does, so the layout is
# theirs: the meta kernel runs first (its checks and shapes), then the same call on fake CPU tensors gives the strides
# (PyTorch's test_memory_format of the conv modules).
@functools.cache
def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def _cpu_layout(func):
    def run(*args, **kwargs):
        out = func(*args, **kwargs)
        # an empty batch runs on CPU itself (fake tensors answer contiguous there; CPU computes nothing)
        empty = any(isinstance(v, torch.Tensor) and v.numel() == 0 for v in torch.utils._pytree.tree_leaves(args))
        mode = contextlib.nullcontext() if empty else _fake_mode()

        def fake(v):
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype) if isinstance(v, torch.Tensor) else v

        try:
            with mode:
                faked = func(*torch.utils._pytree.tree_map(fake, args), **torch.utils._pytree.tree_map(fake, kwargs))
        except Exception:  # a call fake tensors cannot run keeps the meta kernel's (contiguous) layout
            return out
        return _restrided(out, faked)

    return run


def _restrided(out, like):
    """The meta outputs ``out`` with the strides of ``like``'s (the same call run elsewhere)."""
    return torch.utils._pytree.tree_map(
        lambda m, c: m.as_strided(m.shape, c.stride()) if isinstance(m, torch.Tensor) else m, out, like
    )


# Note [Suggested layouts]: CPU's padding and group-norm kernels allocate their output (the input gradient, for the
# paddings' backwards) in the memory format that the input suggests (``suggest_memory_format``: channels-last for a
# 4-D or 5-D input whose strides are like channels-last, whatever the op's rank); the meta kernels allocate contiguous
# ones (PyTorch's test_memory_format of the padding modules). GroupNorm's input gradient stays contiguous, as on CUDA:
# torch's derivative formula makes the saved input contiguous on every device but CPU before its backward runs.
def _suggested_layout(func, source: int = 0):
    def run(*args, **kwargs):
        out = func(*args, **kwargs)
        fmt = torch._prims_common.suggest_memory_format(args[source])
        if fmt is torch.contiguous_format:
            return out
        first = out[0] if isinstance(out, tuple) else out
        strides = torch.empty(first.shape, device="meta", memory_format=fmt).stride()
        first = first.as_strided(first.shape, strides)
        return (first, *out[1:]) if isinstance(out, tuple) else first

    return run


# Note [Attention layouts]: CPU's flash attention kernel (4-d inputs, no dropout, equal head dims, unit last strides)
# returns an output laid out like its query (``empty_like``); its math kernel (everything else) returns a contiguous
# one. The meta kernels of the fused ops return CUDA's layout (batch, sequence, heads, features), so ``out.view(...)``
# that works on CPU failed on tpu, and the other way round. (H, S, E) inputs run torch's math kernel on tpu as on CPU.
# The fused backward's gradients have the flash kernel's layouts; where CPU runs its math kernel on 4-d inputs
# (dropout, other head dims) its gradients' strides differ (the values do not; ``.grad`` of a leaf takes the leaf's
# layout either way).
def _attention_layout(func, dropout: int):
    def run(query, key, value, *args, **kwargs):
        out = func(query, key, value, *args, **kwargs)
        flash = (
            (args[dropout] if len(args) > dropout else kwargs.get("dropout_p", 0.0)) == 0
            and query.size(-1) == key.size(-1) == value.size(-1)
            and query.stride(-1) == key.stride(-1) == value.stride(-1) == 1
        )
        strides = torch.empty_like(query).stride() if flash else make_contiguous_strides_for(out[0].shape)
        return out[0].as_strided(out[0].shape, strides), *out[1:]

    return run


def _dense(func, *, padded_only: bool = True):
    """``func``'s meta outputs with CPU's dense strides where the meta kernel pads
    them as CUDA's kernel does (the attention bias gradient: last dim to 16), or
    everywhere (``padded_only=False``: ``nonzero_static``, column-major as CUDA's)."""

    def run(*args, **kwargs):
        def dense(m):
            if not isinstance(m, torch.Tensor) or (
                padded_only and torch._prims_common.is_non_overlapping_and_dense_or_false(m)
            ):
                return m
            return m.as_strided(m.shape, make_contiguous_strides_for(m.shape))

        return torch.utils._pytree.tree_map(dense, func(*args, **kwargs))

    return run


def _first_dtype(func):
    """``func``'s meta output in its first argument's dtype, as CPU's kernel
    allocates it (``empty_like(input)``); the meta kernel (from torch._refs)
    promotes, so a float64 target made the loss float64."""

    def run(x, *args, **kwargs):
        return func(x, *args, **kwargs).to(x.dtype)

    return run


def _addr(x, vec1, vec2, *, beta=1, alpha=1):
    """CPU's kernel expands ``x`` before promoting: a 0-dim ``x`` counts as a
    dimensioned operand (the meta kernel lets bfloat16 vectors win over it)."""
    out = aten.addr.default(x, vec1, vec2, beta=beta, alpha=alpha)
    return out.to(torch.promote_types(torch.promote_types(x.dtype, vec1.dtype), vec2.dtype))


_PADDINGS = [f"{kind}_pad{k}d" for kind in ("reflection", "replication") for k in (1, 2, 3)]

FIXES = {
    aten.convolution.default: _cpu_layout(aten.convolution.default),
    aten.convolution_backward.default: _cpu_layout(aten.convolution_backward.default),
    # meta kernels that give CUDA's layout on a meta tensor (row-major eigenvectors and ``Vh``, cuFFT's order)
    **{op: _cpu_layout(op) for op in (aten._linalg_svd.default, aten.linalg_eig.default)},
    **{op: _cpu_layout(op) for op in (aten._fft_r2c.default, aten._fft_c2c.default, aten._fft_c2r.default)},
    **{
        op: _suggested_layout(_padding_dims(op, k))
        for k in (1, 2, 3)
        for op in (getattr(aten, f"reflection_pad{k}d").default, getattr(aten, f"replication_pad{k}d").default)
    },
    **{
        getattr(aten, f"{name}_backward").default: _suggested_layout(getattr(aten, f"{name}_backward").default, 1)
        for name in _PADDINGS
    },
    aten.native_group_norm.default: _float_statistics(_suggested_layout(aten.native_group_norm.default)),
    aten.max_pool3d_with_indices.default: _max_pool3d,
    aten._scaled_dot_product_efficient_attention.default: _attention_layout(
        aten._scaled_dot_product_efficient_attention.default, dropout=2
    ),
    aten._scaled_dot_product_efficient_attention_backward.default: _dense(
        aten._scaled_dot_product_efficient_attention_backward.default
    ),
    aten._scaled_dot_product_fused_attention_overrideable.default: _attention_layout(
        aten._scaled_dot_product_fused_attention_overrideable.default, dropout=1
    ),
    aten.nonzero_static.default: _dense(aten.nonzero_static.default, padded_only=False),
    aten._embedding_bag.default: _embedding_bag_dims(aten._embedding_bag.default),
    aten._embedding_bag_forward_only.default: _embedding_bag_dims(aten._embedding_bag_forward_only.default),
    aten.fractional_max_pool3d.default: _fractional_max_pool3d,
    aten._ctc_loss.default: _nonempty_log_probs(aten._ctc_loss.default),
    aten._ctc_loss.Tensor: _nonempty_log_probs(aten._ctc_loss.Tensor),
    aten.multi_margin_loss.default: _multi_margin_loss,
    aten.repeat_interleave.Tensor: _repeat_interleave,
    **fake_quant.FIXES,
    aten.multilabel_margin_loss_forward.default: _multilabel_margin_loss,
    # its meta kernel wants ``high`` on CPU (a meta tensor is not); the overload without a generator's does not
    aten.randint_like.Tensor_generator: lambda x, high, generator=None, **kw: aten.randint_like.Tensor(x, high, **kw),
    **{
        op: _first_dtype(op)
        for op in (aten.huber_loss.default, aten.soft_margin_loss.default, aten.normal.Tensor_Tensor)
    },
    aten.addr.default: _addr,
    aten.pow.Tensor_Scalar: _bool_power(aten.pow.Tensor_Scalar),
    aten.pow_.Scalar: _bool_power(aten.pow_.Scalar),
    aten.nll_loss_forward.default: _byte_target(aten.nll_loss_forward.default, 1),
    aten.nll_loss_backward.default: _byte_target(aten.nll_loss_backward.default, 2),
}


def _fused_optimizer(func):
    """A fused optimizer's functional form (Note [Fused optimizers]): one
    list like each written argument, in schema order (torch has a meta kernel
    for ``_fused_adam`` alone)."""
    names = [a.name for a in func._schema.arguments]
    listed = [r.name.removesuffix("_out") for r in func._schema.returns]

    def outputs(*args, **kwargs):
        call = dict(zip(names, args), **kwargs)
        return tuple([torch.empty_like(t) for t in call[name]] for name in listed)

    return outputs


_FUSED_OPTIMIZERS = [
    getattr(getattr(aten, name), overload)
    for name in ("_fused_adam", "_fused_adamw", "_fused_sgd", "_fused_adagrad")
    for overload in ("default", "tensor_lr")
]


def _masked_softmax(x, mask, dim=None, mask_type=None):
    """CPU's checks of ``_masked_softmax`` (it has no meta kernel), and its output: ``x``'s shape, contiguous."""
    torch._check(mask.dtype == torch.bool, lambda: "Mask should be a boolean tensor")
    if mask.dim() != 2 or x.dim() != 4:
        mask_type = 2  # types 0 and 1 are for a 2-d mask of a 4-d input only
    torch._check(mask_type is not None, lambda: "Mask Type should be defined")
    if mask_type == 2:
        torch._check(x.shape == mask.shape, lambda: "For mask_type == 2 mask shape should match input shape")
    elif mask_type == 1:
        torch._check(
            x.shape[0] == mask.shape[0] and x.shape[2] == mask.shape[1],
            lambda: "For mask_type == 1 mask shape should be (B, L)",
        )
    elif mask_type == 0:
        torch._check(
            x.shape[2] == mask.shape[0] == mask.shape[1], lambda: "For mask_type == 0 mask shape should be (L, L)"
        )
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


SHAPES = {
    aten._masked_softmax.default: _masked_softmax,
    aten._masked_softmax_backward.default: _like_first,
    # the meta kernels of ``<<`` and ``>>`` refuse bool operands, which CPU promotes
    # (``bool << 1`` is int64) as ``bitwise_*_shift``'s meta kernels do; for a bool or
    # floating result, the kernel check raises CPU's error (Note [Kernel checks])
    aten.__lshift__.Scalar: aten.bitwise_left_shift.Tensor_Scalar,
    aten.__lshift__.Tensor: aten.bitwise_left_shift.Tensor,
    aten.__rshift__.Scalar: aten.bitwise_right_shift.Tensor_Scalar,
    aten.__rshift__.Tensor: aten.bitwise_right_shift.Tensor,
    aten.linalg_lstsq.default: _lstsq,
    aten._ctc_loss_backward.default: _like_input,
    aten.geqrf.default: _geqrf,
    aten._grouped_mm.default: _grouped_mm,
    aten._sample_dirichlet.default: _like_first,
    aten.binomial.default: _like_first,
    aten._standard_gamma_grad.default: _like_first,
    aten._dirichlet_grad.default: _like_first,
    aten._thnn_fused_lstm_cell.default: _lstm_cell,
    aten._thnn_fused_gru_cell.default: _gru_cell,
    aten._thnn_fused_gru_cell_backward.default: _gru_cell_backward,
    aten.multi_margin_loss_backward.default: _like_input,
    aten.multilabel_margin_loss_backward.default: _like_input,
    aten.fractional_max_pool3d_backward.default: _like_input,
    aten.histogram.bin_ct: _histogram,
    aten.histogram.bins_tensor: _histogram_edges,
    aten._histogramdd_bin_edges.default: _histogramdd_edges,
    aten._histogramdd_from_bin_cts.default: _histogramdd_counts,
    aten._histogramdd_from_bin_tensors.default: _histogramdd_tensors,
    **{op: _fused_optimizer(op) for op in _FUSED_OPTIMIZERS},
    **fake_quant.SHAPES,
}


# -- meta inference ------------------------------------------------------------

_META_MEMO = _caches.memo("meta_memo")


def value_key(v):
    """A call value in a memo key: a lifted scalar's kind, a tensor's interned descriptor."""
    if type(v) is Scalar:
        return v.kind
    if type(v) is LazyTensor:
        return v._lt_desc
    return ("cpu", v.shape, v.stride(), v.dtype)


class MetaUnavailable(Exception):
    """torch has no meta kernel for this call (often: its output shape
    depends on data); the op must run where data is (CPU fallback)."""


def infer_meta(func, template, values):
    """Output metas of ``func`` (memoized), or torch's own error.

    Note [Meta errors]: meta kernels sometimes word errors differently from
    the CPU kernels (they come from torch._refs). On a meta failure the op is
    re-run on CPU zeros of the same shapes, so that the error
    raised is the one CPU torch users see. If the CPU run succeeds where meta
    had no kernel (or a stricter one), ``MetaUnavailable`` is raised: the CPU
    run's shapes are not trusted, since they may depend on the (stand-in) data.
    """
    key = (func, template, tuple(value_key(v) for v in values))
    hit = _META_MEMO.get(key)
    if hit is not None:
        return hit
    try:
        out = run_on(FIXES.get(func, func), template, values, "meta")  # Note [Meta shape fixes]
    except Exception as meta_exc:
        missing = SHAPES.get(func)  # Note [Missing meta kernels]
        if missing is not None:
            out = _META_MEMO[key] = run_on(missing, template, values, "meta")
            return out
        try:
            run_on(func, template, values, "cpu")
        except Exception as cpu_exc:
            raise cpu_exc.with_traceback(None) from None
        # CPU accepts the call where meta does not: CPU semantics win, and the
        # op runs where the data is.
        raise MetaUnavailable(f"{type(meta_exc).__name__}: {meta_exc}") from None
    if (torch.Tag.pointwise in func.tags or func._opname.endswith("_like")) and _any_empty(out):
        out = _empty_layout(func, template, values, out)
    _META_MEMO[key] = out
    return out


# Note [Empty pointwise layouts]: torch's meta kernels of pointwise ops and of the ``*_like`` factories come from
# torch._refs, whose output layout is contiguous as soon as every operand "is contiguous", which an empty tensor
# always is; CPU's kernels follow the strides of the operands instead (an empty channels-last batch times a weight
# stays channels-last: a zero-batch BatchNorm's output; ``rand_like`` of it too). An empty output's layout is CPU's:
# the call runs on CPU tensors of the same layouts, which costs nothing (no element is computed).
def _any_empty(out) -> bool:
    return any(isinstance(t, torch.Tensor) and t.numel() == 0 for t in torch.utils._pytree.tree_leaves(out))


def _empty_layout(func, template, values, out):
    def stand_in(v):
        return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype)

    try:
        cpu = run_on(func, template, values, "cpu", stand_in)
    except Exception:  # noqa: BLE001 - the meta kernel accepted the call: its layout stays
        return out
    return _restrided(out, cpu)
