"""Fused optimizers: ``Adam``, ``AdamW``, ``SGD`` and ``Adagrad`` with ``fused=True``.

Note [Fused optimizers]: torch lists ``tpu`` among the devices of its fused
optimizer kernels (``_get_fused_kernels_supported_devices``), so a program
ported from CUDA with ``AdamW(..., fused=True)`` calls ``_fused_adamw_`` on
tpu tensors at every step. Without a rule it ran on CPU: every parameter,
gradient and state tensor copied to the host and back each step. Their
functional forms are lowered here, one node for all of a group's tensors;
the in-place route writes the new values back (Note [Several written
arguments] in ``routes.inplace``).

The formulas are CPU torch's fused kernels (``aten/src/ATen/native/cpu/
Fused{Adam,SGD,Adagrad}Kernel.cpp``), in their order of operations:

- the step count is read as a float and the bias corrections, step size and
  decayed learning rate are computed in double, then rounded to the
  parameters' compute type (float32 for halves, as the kernels' ``opmath``);
- a ``grad_scale`` divides each gradient, and the unscaled gradient is
  written back into ``grads`` (else the gradients are returned untouched);
- a ``found_inf`` of 1.0 leaves every tensor as it was (the kernels return
  before touching anything); nothing is read on the host for it;
- ``exp_avg`` is ``lerp(exp_avg, grad, 1 - beta1)`` in its two-sided form.

One departure: CPU's fused SGD kernel in bfloat16 and float16 (torch 2.13)
leaves the parameters of its vector loop unchanged (it updates only the
elements past the last full vector) and reads its momentum buffers as
float32; every element is updated here, by the formula of its float loop.

Numbers that may be lifted to program inputs (learning rate, betas, weight
decay, momentum: Note [Scalar lifting]) enter the arithmetic only; the
kernels' branches on them (``weight_decay != 0``) are selects.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten
_F64 = jnp.float64


def _compute_dtype(dtype):
    return _F64 if dtype == _F64 else jnp.float32


def _in(dtype):
    """A double-precision number (or 0-d array) rounded to ``dtype`` (``scalar_t(x)`` in the kernels)."""
    return lambda x: jnp.asarray(x, _F64).astype(dtype)


def _wide(x) -> jnp.ndarray:
    return jnp.asarray(x, _F64).reshape(())


def _step(state_step) -> jnp.ndarray:
    """``double step = state_step.item<float>()``."""
    return state_step.reshape(()).astype(jnp.float32).astype(_F64)


def _prologue(p, g, grad_scale, maximize):
    """What every kernel starts with: the cast to the compute type, the unscaled (and for ``maximize``
    negated) gradient, the value written back into ``grads``, and the parameter in the compute type."""
    compute = _compute_dtype(p.dtype)
    grad = g.astype(compute)
    new_g = g
    if grad_scale is not None:
        grad = grad / grad_scale.reshape(()).astype(compute)
        new_g = grad.astype(g.dtype)
    if maximize:
        grad = -grad
    return _in(compute), grad, new_g, p.astype(compute)


def _decay(g, p, weight_decay, cast):
    """``grad += param * weight_decay`` where the weight decay is not zero."""
    return jnp.where(_wide(weight_decay) != 0, g + p * cast(weight_decay), g)


def _append(outs: tuple, found_inf, news: list, olds: list) -> None:
    """Appends each new value to its output list; every output stays as it was when ``found_inf`` is 1.0."""
    if found_inf is not None:
        skip = found_inf.reshape(()) == 1.0
        news = [jnp.where(skip, old, new) for new, old in zip(news, olds)]
    for out, new in zip(outs, news):
        out.append(new)


def _flat(outs) -> tuple:
    return tuple(x for out in outs for x in out)


def _adam(
    decoupled,
    params,
    grads,
    exp_avgs,
    exp_avg_sqs,
    max_exp_avg_sqs,
    state_steps,
    *,
    lr,
    beta1,
    beta2,
    weight_decay,
    eps,
    amsgrad,
    maximize,
    grad_scale=None,
    found_inf=None,
):
    outs: tuple[list, ...] = ([], [], [], [], [])
    for i, (p, g, m, v, step) in enumerate(zip(params, grads, exp_avgs, exp_avg_sqs, state_steps)):
        cast, grad, new_g, param = _prologue(p, g, grad_scale, maximize)
        compute = param.dtype
        step = _step(step)
        lr64 = _wide(lr)
        step_size = lr64 / (1 - jnp.power(_wide(beta1), step))
        bias_correction2_sqrt = jnp.sqrt(1 - jnp.power(_wide(beta2), step))
        if decoupled:
            param = jnp.where(_wide(weight_decay) != 0, param * cast(1 - lr64 * _wide(weight_decay)), param)
        else:
            grad = _decay(grad, param, weight_decay, cast)
        avg = m.astype(compute)
        weight = cast(1 - _wide(beta1))
        diff = grad - avg
        avg = jnp.where(jnp.abs(weight) < 0.5, avg + weight * diff, grad + (weight - 1) * diff)
        avg_sq = v.astype(compute) * cast(beta2) + cast(1 - _wide(beta2)) * grad * grad
        top = jnp.maximum(max_exp_avg_sqs[i].astype(compute), avg_sq) if amsgrad else avg_sq
        param = param + cast(-step_size) * avg / (jnp.sqrt(top) / cast(bias_correction2_sqrt) + cast(eps))
        news = [param.astype(p.dtype), new_g, avg.astype(m.dtype), avg_sq.astype(v.dtype)]
        olds = [p, g, m, v]
        if amsgrad:
            news.append(top.astype(v.dtype))
            olds.append(max_exp_avg_sqs[i])
        _append(outs, found_inf, news, olds)
    return _flat(outs)


@lowering(aten._fused_adam.default, aten._fused_adam.tensor_lr)
def fused_adam(*args, **kwargs):
    """``(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs)`` after an Adam step (Note [Fused optimizers])."""
    return _adam(False, *args, **kwargs)


@lowering(aten._fused_adamw.default, aten._fused_adamw.tensor_lr)
def fused_adamw(*args, **kwargs):
    """The same for AdamW (decoupled weight decay: the parameter is scaled by ``1 - lr * weight_decay``)."""
    return _adam(True, *args, **kwargs)


@lowering(aten._fused_sgd.default, aten._fused_sgd.tensor_lr)
def fused_sgd(
    params,
    grads,
    momentum_buffer_list,
    *,
    weight_decay,
    momentum,
    lr,
    dampening,
    nesterov,
    maximize,
    is_first_step,
    grad_scale=None,
    found_inf=None,
):
    """``(params, grads, momentum_buffer_list)`` after an SGD step (Note [Fused optimizers])."""
    outs: tuple[list, ...] = ([], [], [])
    has_momentum = _wide(momentum) != 0
    for i, (p, g) in enumerate(zip(params, grads)):
        cast, grad, new_g, param = _prologue(p, g, grad_scale, maximize)
        grad = _decay(grad, param, weight_decay, cast)
        olds, news = [p, g], [None, new_g]
        if momentum_buffer_list:  # torch passes none when momentum is 0 (its kernel checks the count)
            old = momentum_buffer_list[i]
            kept = old.astype(param.dtype) * cast(momentum)
            buf = grad if is_first_step else kept + grad * cast(1 - _wide(dampening))
            stepped = grad + buf * cast(momentum) if nesterov else buf
            grad = jnp.where(has_momentum, stepped, grad)
            olds.append(old)
            news.append(jnp.where(has_momentum, buf.astype(old.dtype), old))
        news[0] = (param + grad * cast(-_wide(lr))).astype(p.dtype)
        _append(outs, found_inf, news, olds)
    return _flat(outs)


def _adagrad(
    params,
    grads,
    state_sums,
    state_steps,
    *,
    lr,
    lr_decay,
    weight_decay,
    eps,
    maximize,
    grad_scale=None,
    found_inf=None,
):
    outs: tuple[list, ...] = ([], [], [])
    for p, g, s, step in zip(params, grads, state_sums, state_steps):
        cast, grad, new_g, param = _prologue(p, g, grad_scale, maximize)
        clr = _wide(lr) / (1.0 + (_step(step) - 1.0) * _wide(lr_decay))
        grad = _decay(grad, param, weight_decay, cast)
        total = s.astype(param.dtype) + grad * grad
        param = param - cast(clr) * grad / (jnp.sqrt(total) + cast(eps))
        _append(outs, found_inf, [param.astype(p.dtype), new_g, total.astype(s.dtype)], [p, g, s])
    return _flat(outs)


@lowering(aten._fused_adagrad.default)
def fused_adagrad(params, grads, state_sums, state_steps, **kwargs):
    """``(params, grads, state_sums, state_steps)`` after an Adagrad step (Note [Fused optimizers]); the
    steps are returned as they came (torch's optimizer counts them before the call)."""
    return (*_adagrad(params, grads, state_sums, state_steps, **kwargs), *state_steps)


@lowering(aten._fused_adagrad.tensor_lr)
def fused_adagrad_tensor_lr(params, grads, state_sums, state_steps, **kwargs):
    """The same with a tensor learning rate: ``(params, grads, state_sums)``."""
    return _adagrad(params, grads, state_sums, state_steps, **kwargs)
