"""Convolutions (plain, grouped, dilated, transposed; 1-3 spatial dims) and their backward.

``conv1d/2d/3d`` and ``conv_transpose*`` are CompositeImplicit in torch: they
arrive here as ``convolution`` (a batched input, every argument explicit);
autograd's backward is ``convolution_backward``.

Note [Transposed convolution]: torch stores a transposed convolution's weight
as ``(C_in, C_out // groups, *k)``. It is the gradient of a plain convolution
with respect to its input, so it runs as a plain convolution over the input
dilated by ``stride`` with the kernel flipped, in/out channels swapped within
each group, and padding ``dilation * (k - 1) - padding`` on each side (plus
``output_padding`` on the high side).
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import torch

from lazytpu.lowering.reduction import upcast
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten

_SPATIAL = "DHW"


def _dimension_numbers(nd: int) -> tuple[str, str, str]:
    spatial = _SPATIAL[-nd:] if nd <= 3 else None
    if spatial is None:
        raise NotImplementedError(f"lazytpu: convolution with {nd} spatial dims")
    return "NC" + spatial, "OI" + spatial, "NC" + spatial


def _transposed_weight(w, groups: int):
    """``(C_in, C_out // g, *k)`` -> ``(C_out, C_in // g, *k)``, flipped (Note [Transposed convolution])."""
    c_in, c_out_g, *k = w.shape
    w = w.reshape(groups, c_in // groups, c_out_g, *k).swapaxes(1, 2).reshape(groups * c_out_g, c_in // groups, *k)
    return jnp.flip(w, axis=tuple(range(2, w.ndim)))


def conv(x, w, stride, padding, dilation, transposed, output_padding, groups):
    """The convolution of ``x`` by ``w`` (no bias), as torch defines it."""
    nd = x.ndim - 2
    dn = _dimension_numbers(nd)
    # Half inputs accumulate in float32, as torch's CPU kernels do.
    acc = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else None
    if not transposed:
        return jax.lax.conv_general_dilated(
            x,
            w,
            window_strides=tuple(stride),
            padding=[(p, p) for p in padding],
            rhs_dilation=tuple(dilation),
            dimension_numbers=dn,
            feature_group_count=groups,
            preferred_element_type=acc,
        )
    k = w.shape[2:]
    pads = [(d * (kk - 1) - p, d * (kk - 1) - p + op) for kk, p, d, op in zip(k, padding, dilation, output_padding)]
    return jax.lax.conv_general_dilated(
        x,
        _transposed_weight(w, groups),
        window_strides=(1,) * nd,
        padding=pads,
        lhs_dilation=tuple(stride),
        rhs_dilation=tuple(dilation),
        dimension_numbers=dn,
        feature_group_count=groups,
        preferred_element_type=acc,
    )


def _attrs(x, stride, padding, dilation, transposed, output_padding, groups) -> tuple:
    """``conv``'s attributes with one value per spatial dim (torch allows one value for all)."""
    nd = x.ndim - 2

    def expand(values):
        values = tuple(values)
        return values * nd if len(values) == 1 else values

    return expand(stride), expand(padding), expand(dilation), transposed, expand(output_padding), groups


def _conv_transpose_col2im(x, w, stride, padding, dilation, output_padding, groups):
    """A half transposed convolution as torch's CPU ``slow_conv_transpose``:
    one product per kernel tap (``gemm``: float32 accumulation over the input
    channels, rounded to the half dtype), then ``col2im`` adds the taps into
    the output one by one, in tap order, each sum rounded."""
    nd = x.ndim - 2
    n, cin, space, taps = x.shape[0], x.shape[1], x.shape[2:], w.shape[2:]
    cout_g = w.shape[1]
    out_size = [
        (space[i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (taps[i] - 1) + output_padding[i] + 1
        for i in range(nd)
    ]
    xg = x.reshape((n, groups, cin // groups) + space).astype(jnp.float32)
    wg = w.reshape((groups, cin // groups, cout_g) + taps).astype(jnp.float32)
    sp, kk = "xyz"[:nd], "uvw"[:nd]
    cols = jnp.einsum(f"ngc{sp},gco{kk}->ngo{kk}{sp}", xg, wg, precision=jax.lax.Precision.HIGHEST)
    cols = cols.astype(x.dtype).reshape((n, groups * cout_g) + taps + space)
    out = jnp.zeros((n, groups * cout_g) + tuple(out_size), x.dtype)
    for tap in itertools.product(*(range(k) for k in taps)):
        config = [(0, 0, 0), (0, 0, 0)]
        for i in range(nd):
            low = tap[i] * dilation[i] - padding[i]
            config.append((low, out_size[i] - low - (space[i] - 1) * stride[i] - 1, stride[i] - 1))
        placed = jax.lax.pad(cols[(slice(None), slice(None), *tap)], jnp.zeros((), x.dtype), config)
        out = (out.astype(jnp.float32) + placed.astype(jnp.float32)).astype(x.dtype)
    return out


def _slow_conv_transpose(dtype, stride, output_padding) -> bool:
    """Whether torch's CPU convolution takes ``slow_conv_transpose`` (col2im)
    for a half transposed convolution rather than oneDNN (one rounding of a
    float32 result): ``ConvParams::use_mkldnn`` refuses an output padding as
    large as the stride, and float16 wherever the CPU lacks oneDNN's float16
    support (AVX512-FP16 or AMX-FP16: ``_onednn_float16``), bfloat16 where it
    lacks bfloat16 support."""
    if dtype == jnp.float16 and not _onednn_float16():
        return True
    if dtype == jnp.bfloat16 and not _onednn_bfloat16():
        return True
    return dtype in (jnp.bfloat16, jnp.float16) and any(p >= s for p, s in zip(output_padding, stride))


@functools.cache
def _onednn_bfloat16() -> bool:
    """Whether this host's CPU torch runs bfloat16 convolutions in oneDNN
    (ideep's ``has_bf16_type_support``: AVX512 core or newer)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@functools.cache
def _onednn_float16() -> bool:
    """Whether this host's CPU torch runs float16 convolutions in oneDNN
    (ideep's ``has_fp16_type_support``: AVX512-FP16 or AMX-FP16), so that the
    results tpu must match are computed that way."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        flags = ""
    return " avx512_fp16" in flags or " amx_fp16" in flags or torch.cpu._is_amx_fp16_supported()


@lowering(aten.convolution.default, aten.convolution_overrideable.default)
def convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    attrs = _attrs(x, stride, padding, dilation, transposed, output_padding, groups)
    if transposed and x.size and w.size and _slow_conv_transpose(x.dtype, attrs[0], attrs[4]):
        out = _conv_transpose_col2im(x, w, attrs[0], attrs[1], attrs[2], attrs[4], groups)
    else:
        out = conv(x, w, *attrs)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * (x.ndim - 2))
    return out


@lowering(aten.convolution_backward.default, aten.convolution_backward_overrideable.default)
def convolution_backward(grad_output, x, w, *rest):
    # convolution_backward has ``bias_sizes`` before ``stride``; the overrideable form has not.
    if len(rest) == 8:
        rest = rest[1:]
    *attrs, output_mask = rest
    if 0 in (x.size, w.size, grad_output.size):  # nothing flows: zeros of each shape (CPU's empty convolution)
        grads = (jnp.zeros_like(x), jnp.zeros_like(w), jnp.zeros((), grad_output.dtype))  # the bias's: broadcast
        return tuple(g for g, wanted in zip(grads, output_mask) if wanted)
    attrs = _attrs(x, *attrs)
    _, vjp = jax.vjp(lambda a, b: conv(a, b, *attrs).astype(grad_output.dtype), x, w)
    grad_x, grad_w = vjp(grad_output)
    grad_b = jnp.sum(upcast(grad_output), axis=(0,) + tuple(range(2, grad_output.ndim)))
    return tuple(g for g, wanted in zip((grad_x, grad_w, grad_b), output_mask) if wanted)


@lowering(aten.conv_tbc.default)
def conv_tbc(x, w, bias, pad=0):
    """A 1-d convolution over time-major ``(T, B, C_in)`` input with a ``(K, C_in, C_out)``
    weight, summed as CPU's kernel sums it: the bias, then one ``addmm`` per kernel tap
    into the output rows it reaches, rounded to the dtype after each (its backward is
    composite: conv_tbc again, with the weight's taps reversed)."""
    ilen, batch, _ = x.shape
    kw, _, c_out = w.shape
    olen = ilen - kw + 1 + 2 * pad
    out = jnp.broadcast_to(bias.astype(x.dtype), (max(olen, 0), batch, c_out))
    wide = upcast(x).dtype
    for k in range(kw):
        i_shift, o_shift = max(0, k - pad), max(0, pad - k)
        t = min(ilen + pad - k, olen) - o_shift
        if t > 0:
            tap = jnp.matmul(x[i_shift : i_shift + t], w[k], preferred_element_type=wide)
            out = out.at[o_shift : o_shift + t].set((out[o_shift : o_shift + t] + tap).astype(x.dtype))
    return out
