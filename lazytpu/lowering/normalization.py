"""Batch norm: the functional forward forms and the backward.

Note [native_batch_norm mutates]: eager ``BatchNorm*d`` arrives as
``native_batch_norm``, whose schema claims to be functional although in
training it updates ``running_mean``/``running_var`` in place. A pure rule
would silently drop that update, so the op has no rule: torch's
decomposition runs instead (``var_mean`` and element-wise ops, then
``running_mean.copy_(...)``), which the dispatcher records as a write. The
truly functional forms (``_native_batch_norm_legit_functional``,
``_no_training``, ``.no_stats``; what export and AOT graphs use) and the
backward are lowered here. ``instance_norm`` is CompositeImplicit in torch
(batch norm over a reshaped input); layer and group norm live in ``nn``.

Statistics are over every dim but the channel dim 1; half inputs compute in
float32, and the saved mean and inverse std are float32, as torch's kernels.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazytpu.lowering.elementwise import rsqrt
from lazytpu.lowering.reduction import upcast
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _axes(x) -> tuple[int, ...]:
    return (0,) + tuple(range(2, x.ndim))


def _channel(v, x):
    """A per-channel vector shaped to broadcast against ``x``."""
    return v.reshape((1, -1) + (1,) * (x.ndim - 2))


def _affine(out, weight, bias, x):
    if weight is not None:
        out = out * _channel(weight, x)
    if bias is not None:
        out = out + _channel(bias, x)
    return out


def _train_forward(x, weight, bias, eps):
    """Normalize with batch statistics; returns (out, mean, invstd, biased var)."""
    xf = upcast(x)
    ax = _axes(x)
    mean = jnp.mean(xf, axis=ax)
    var = jnp.mean(jnp.square(xf - _channel(mean, x)), axis=ax)
    invstd = rsqrt(var + eps)
    out = (xf - _channel(mean, x)) * _channel(invstd, x)
    return _affine(out, weight, bias, x), mean, invstd, var


def _eval_forward(x, weight, bias, running_mean, running_var, eps):
    invstd = rsqrt(upcast(running_var) + eps)
    out = (upcast(x) - _channel(upcast(running_mean), x)) * _channel(invstd, x)
    return _affine(out, weight, bias, x), upcast(running_mean), invstd


def _updated_stats(x, mean, var, running_mean, running_var, momentum):
    """Running statistics after one training step (the variance is unbiased)."""
    n = x.size // x.shape[1]
    new_mean = momentum * mean + (1 - momentum) * running_mean
    new_var = momentum * var * (n / max(n - 1, 1)) + (1 - momentum) * running_var
    return new_mean, new_var


@lowering(aten._native_batch_norm_legit_functional.default)
def batch_norm_functional(x, weight, bias, running_mean, running_var, training, momentum, eps):
    if not training:
        out, mean, invstd = _eval_forward(x, weight, bias, running_mean, running_var, eps)
        return out, mean, invstd, running_mean, running_var
    out, mean, invstd, var = _train_forward(x, weight, bias, eps)
    return (out, mean, invstd) + _updated_stats(x, mean, var, running_mean, running_var, momentum)


@lowering(aten._native_batch_norm_legit_no_training.default)
def batch_norm_no_training(x, weight, bias, running_mean, running_var, momentum, eps):
    return _eval_forward(x, weight, bias, running_mean, running_var, eps)


@lowering(aten._native_batch_norm_legit.no_stats)
def batch_norm_no_stats(x, weight, bias, training, momentum, eps):
    return _train_forward(x, weight, bias, eps)[:3]


@lowering(aten.native_batch_norm_backward.default)
def native_batch_norm_backward(
    grad_out, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    ax = _axes(x)
    g = upcast(grad_out)
    if train:
        mean, invstd = save_mean, save_invstd
    else:
        mean, invstd = upcast(running_mean), rsqrt(upcast(running_var) + eps)
    xhat = (upcast(x) - _channel(mean, x)) * _channel(invstd, x)
    sum_g = jnp.sum(g, axis=ax)
    sum_gx = jnp.sum(g * xhat, axis=ax)
    scale = _channel(invstd if weight is None else invstd * weight, x)
    if train:
        n = x.size // x.shape[1]
        grad_x = (g - _channel(sum_g / n, x) - xhat * _channel(sum_gx / n, x)) * scale
    else:
        grad_x = g * scale
    # the outputs torch's meta kernel gives: grad_input always (unwanted, it is dead code), the others as asked
    return (grad_x, *(grad for grad, wanted in zip((sum_gx, sum_g), output_mask[1:]) if wanted))
