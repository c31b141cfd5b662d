"""Neural-network ops: softmax, losses, embedding, layer/group norm, dropout.

Forward ops and the backward ops autograd emits for them, so that training
steps stay on device. Element-wise activations live in ``elementwise``.

Note [Loss reduction]: the ``int reduction`` argument of torch's losses is
``0`` none, ``1`` mean, ``2`` sum (``torch.nn._reduction``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from lazytpu.lowering.elementwise import rsqrt
from lazytpu.lowering.reduction import axes, count, upcast
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten

_NONE, _MEAN, _SUM = 0, 1, 2


def _reduce(loss, reduction: int):
    """Apply a loss reduction (Note [Loss reduction])."""
    if reduction == _MEAN:
        return jnp.mean(loss)
    if reduction == _SUM:
        return jnp.sum(loss)
    return loss


def _reduce_grad(grad, shape, reduction: int):
    """The gradient flowing into each element of an unreduced loss of ``shape``."""
    grad = jnp.broadcast_to(grad, shape)
    return grad / count(grad, range(grad.ndim)) if reduction == _MEAN else grad


# -- softmax -------------------------------------------------------------------


def _softmax_axis(x, dim):
    """A 0-d input softmaxes over a size-1 axis; returns (an at-least-1-d input, its axis)."""
    return (x.reshape(1), 0) if x.ndim == 0 else (x, dim % x.ndim)


@lowering(aten._softmax.default)
def softmax(x, dim, half_to_float):
    y, axis = _softmax_axis(upcast(x), dim)
    return jax.nn.softmax(y, axis=axis).reshape(x.shape)


@lowering(aten._log_softmax.default)
def log_softmax(x, dim, half_to_float):
    y, axis = _softmax_axis(upcast(x), dim)
    return jax.nn.log_softmax(y, axis=axis).reshape(x.shape)


@lowering(aten._softmax_backward_data.default)
def softmax_backward(grad_output, output, dim, input_dtype):
    g, y = upcast(grad_output), upcast(output)
    ax = axes(g, [dim])
    return y * (g - jnp.sum(g * y, axis=ax, keepdims=True))


def _full_mask(x, mask, mask_type):
    """``_masked_softmax``'s mask as one of ``x``'s shape (True: left out): a 2-d mask of a
    4-d input is ``(L, L)`` (type 0) or a ``(B, L)`` key padding mask (type 1)."""
    if mask.ndim == 2 and x.ndim == 4 and mask_type == 0:
        mask = mask.reshape(1, 1, *mask.shape)
    elif mask.ndim == 2 and x.ndim == 4 and mask_type == 1:
        mask = mask.reshape(mask.shape[0], 1, 1, mask.shape[1])
    return jnp.broadcast_to(mask, x.shape)


@lowering(aten._masked_softmax.default)
def masked_softmax(x, mask, dim=None, mask_type=None):
    """CPU's masked softmax: the masked elements are 0 and take no part in the max and
    the sum; a row masked whole is NaN there (``0 / 0``), as on CPU."""
    y, axis = _softmax_axis(upcast(x), x.ndim - 1 if dim is None else dim)
    keep = ~_full_mask(y, mask.reshape(y.shape) if x.ndim == 0 else mask, mask_type)
    top = jnp.max(jnp.where(keep, y, -jnp.inf), axis=axis, keepdims=True)
    e = jnp.where(keep, jnp.exp(y - top), 0)
    return (e / jnp.sum(e, axis=axis, keepdims=True)).reshape(x.shape)


@lowering(aten._masked_softmax_backward.default)
def masked_softmax_backward(grad_output, output, mask, dim=None):
    g, y = upcast(grad_output), upcast(output)
    keep = ~jnp.broadcast_to(mask, g.shape)
    ax = axes(g, [g.ndim - 1 if dim is None else dim])
    g = jnp.where(keep, g, 0)
    return jnp.where(keep, y * (g - jnp.sum(g * y, axis=ax, keepdims=True)), 0)


@lowering(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad_output, output, dim, input_dtype):
    g, y = upcast(grad_output), upcast(output)
    ax = axes(g, [dim])
    return g - jnp.exp(y) * jnp.sum(g, axis=ax, keepdims=True)


# -- negative log likelihood ---------------------------------------------------


def _nll_parts(x, target, weight, ignore_index):
    """Per-element (picked log-prob, weight, kept, safe target, class axis) for nll_loss/nll_loss2d.

    The class dim is 1 (0 for an unbatched ``(C,)`` input); ignored targets get
    weight 0 and a safe in-range index.
    """
    class_axis = 0 if x.ndim == 1 else 1
    target = target.astype(jnp.int64)  # a uint8 target as CPU takes it (no wrap of ignore_index)
    keep = target != ignore_index
    safe = jnp.where(keep, target, 0)
    w = jnp.ones(target.shape, x.dtype) if weight is None else weight[safe].astype(x.dtype)
    w = jnp.where(keep, w, 0)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe, class_axis), axis=class_axis)
    return jnp.squeeze(picked, class_axis), w, keep, safe, class_axis


@lowering(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def nll_loss(x, target, weight, reduction, ignore_index):
    picked, w, _, _, _ = _nll_parts(x, target, weight, ignore_index)
    loss = -picked * w
    total_weight = jnp.sum(w)
    if reduction == _NONE:
        return loss, total_weight
    total = jnp.sum(loss)
    return (total / total_weight if reduction == _MEAN else total), total_weight


@lowering(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def nll_loss_backward(grad_output, x, target, weight, reduction, ignore_index, total_weight):
    _, w, keep, safe, class_axis = _nll_parts(x, target, weight, ignore_index)
    scale = grad_output / total_weight if reduction == _MEAN else grad_output
    # Ignored targets get exactly 0, even where the scale is nan (all ignored).
    picked_grad = jnp.where(keep, -w * scale, 0)
    classes = jnp.arange(x.shape[class_axis]).reshape((-1,) + (1,) * (x.ndim - class_axis - 1))
    hit = jnp.expand_dims(safe, class_axis) == classes
    return jnp.where(hit, jnp.expand_dims(picked_grad, class_axis), 0)


# -- regression and binary losses ----------------------------------------------


@lowering(aten.mse_loss.default)
def mse_loss(x, target, reduction=_MEAN):
    return _reduce(jnp.square(x - target), reduction)


@lowering(aten.mse_loss_backward.default)
def mse_loss_backward(grad_output, x, target, reduction):
    diff = x - target
    return 2 * diff * _reduce_grad(grad_output, diff.shape, reduction)


@lowering(aten.huber_loss.default)
def huber_loss(x, target, reduction=_MEAN, delta=1.0):
    d = jnp.abs(x - target)
    return _reduce(jnp.where(d < delta, 0.5 * d * d, delta * (d - 0.5 * delta)), reduction)


@lowering(aten.huber_loss_backward.default)
def huber_loss_backward(grad_output, x, target, reduction, delta):
    diff = x - target
    return jnp.clip(diff, -delta, delta) * _reduce_grad(grad_output, diff.shape, reduction)


# torch clamps log terms at -100 so that log(0) gives a finite loss.
_LOG_FLOOR = -100.0
# ...and the gradient's denominator at this epsilon.
_BCE_EPS = 1e-12


@lowering(aten.binary_cross_entropy.default)
def binary_cross_entropy(x, target, weight=None, reduction=_MEAN):
    log_x = jnp.maximum(jnp.log(x), _LOG_FLOOR)
    log_1mx = jnp.maximum(jnp.log1p(-x), _LOG_FLOOR)
    loss = -(target * log_x + (1 - target) * log_1mx)
    return _reduce(loss if weight is None else loss * weight, reduction)


@lowering(aten.binary_cross_entropy_backward.default)
def binary_cross_entropy_backward(grad_output, x, target, weight=None, reduction=_MEAN):
    grad = (x - target) / jnp.maximum((1 - x) * x, _BCE_EPS)
    grad = grad * _reduce_grad(grad_output, x.shape, reduction)
    return grad if weight is None else grad * weight


@lowering(aten.binary_cross_entropy_with_logits.default)
def binary_cross_entropy_with_logits(x, target, weight=None, pos_weight=None, reduction=_MEAN):
    softplus_neg = jnp.logaddexp(0, -x)  # log(1 + exp(-x)), stable
    log_weight = 1 if pos_weight is None else (pos_weight - 1) * target + 1
    loss = (1 - target) * x + log_weight * softplus_neg
    return _reduce(loss if weight is None else loss * weight, reduction)


# -- embedding -----------------------------------------------------------------


@lowering(aten.embedding.default)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


@lowering(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat = indices.reshape(-1)
    grad = upcast(grad_output).reshape(flat.shape[0], grad_output.shape[-1])
    if padding_idx >= 0:
        grad = jnp.where((flat == padding_idx)[:, None], 0, grad)
    if scale_grad_by_freq:
        counts = jnp.zeros(num_weights, grad.dtype).at[flat].add(1)
        grad = grad / counts[flat][:, None]
    return jnp.zeros((num_weights, grad.shape[1]), grad.dtype).at[flat].add(grad)


# -- layer norm and group norm -------------------------------------------------


def _standardize(x, ax, eps):
    """``(x - mean) * rstd`` over ``ax`` (biased variance), with mean and rstd kept as dims."""
    x = upcast(x)
    mu = jnp.mean(x, axis=ax, keepdims=True)
    rstd = rsqrt(jnp.mean(jnp.square(x - mu), axis=ax, keepdims=True) + eps)
    return (x - mu) * rstd, mu, rstd


def _standardize_backward(g, xhat, rstd, ax):
    """The input gradient of ``_standardize`` given the gradient ``g`` of its output."""
    g_mean = jnp.mean(g, axis=ax, keepdims=True)
    gx_mean = jnp.mean(g * xhat, axis=ax, keepdims=True)
    return rstd * (g - g_mean - xhat * gx_mean)


def _affine(out, weight, bias, shape):
    """Scale and shift by per-feature ``weight``/``bias`` reshaped to ``shape``."""
    if weight is not None:
        out = out * weight.reshape(shape)
    if bias is not None:
        out = out + bias.reshape(shape)
    return out


def _norm_axes(x, normalized_shape) -> tuple[int, ...]:
    return tuple(range(x.ndim - len(normalized_shape), x.ndim))


@lowering(aten.native_layer_norm.default)
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    xhat, mu, rstd = _standardize(x, _norm_axes(x, normalized_shape), eps)
    return _affine(xhat, weight, bias, tuple(normalized_shape)), mu, rstd


@lowering(aten.native_layer_norm_backward.default)
def native_layer_norm_backward(grad_out, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    ax = _norm_axes(x, normalized_shape)
    batch_ax = tuple(range(x.ndim - len(normalized_shape)))
    g_out = upcast(grad_out)
    xhat = (upcast(x) - mean) * rstd
    g = g_out if weight is None else g_out * weight
    grads = (
        _standardize_backward(g, xhat, rstd, ax),
        jnp.sum(g_out * xhat, axis=batch_ax),
        jnp.sum(g_out, axis=batch_ax),
    )
    return tuple(grad for grad, wanted in zip(grads, output_mask) if wanted)


# Group norm works on (N, group, C // group * HxW): one standardization per
# sample and group; weight and bias are per channel, (1, C, 1).


def _per_channel(stat, c, group):
    """A per-(sample, group) statistic, (N, group), as (N, C, 1)."""
    return jnp.repeat(stat, c // group, axis=1)[:, :, None]


@lowering(aten.native_group_norm.default)
def native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    xhat, mu, rstd = _standardize(x.reshape(n, group, c // group * hxw), (2,), eps)
    out = _affine(xhat.reshape(n, c, hxw), weight, bias, (1, c, 1))
    return out.reshape(x.shape), mu.reshape(n, group), rstd.reshape(n, group)


@lowering(aten.native_group_norm_backward.default)
def native_group_norm_backward(grad_out, x, mean, rstd, weight, n, c, hxw, group, output_mask):
    g_out = upcast(grad_out).reshape(n, c, hxw)
    xhat = (upcast(x).reshape(n, c, hxw) - _per_channel(mean, c, group)) * _per_channel(rstd, c, group)
    g = g_out if weight is None else g_out * weight.reshape(1, c, 1)
    grouped = (n, group, c // group * hxw)
    dx = _standardize_backward(g.reshape(grouped), xhat.reshape(grouped), rstd[:, :, None], (2,))
    grads = (dx.reshape(x.shape), jnp.sum(g_out * xhat, axis=(0, 2)), jnp.sum(g_out, axis=(0, 2)))
    return tuple(grad for grad, wanted in zip(grads, output_mask) if wanted)


# -- dropout -------------------------------------------------------------------


@lowering(aten.native_dropout.default, random=True)
def native_dropout(x, p, train, *, key):
    if train is False:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(key, 1 - p, x.shape)
    scale = jnp.where(p < 1, 1 / (1 - p), 0)
    return jnp.where(keep, x * scale, 0), keep


@lowering(aten.native_dropout_backward.default)
def native_dropout_backward(grad_output, mask, scale):
    return grad_output * mask * scale
