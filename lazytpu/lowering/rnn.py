"""Recurrent cells: the fused LSTM and GRU cells ATen calls for a PrivateUse1 device.

Note [Fused RNN cells]: on CUDA, XPU and PrivateUse1 inputs, ATen's
``LSTMCell``/``GRUCell`` (``aten/src/ATen/native/RNN.cpp``, behind
``nn.LSTM``, ``nn.GRU``, ``nn.LSTMCell``, ``nn.GRUCell``, packed sequences
included) compute the two gate products with ``linear`` and hand the
element-wise rest to ``_thnn_fused_lstm_cell``/``_thnn_fused_gru_cell``.
These rules follow the CUDA kernels (``aten/src/ATen/native/cuda/RNN.cu``):
gates are computed in float32 for half inputs and stored in the input dtype;
the workspace the backward reads holds

- LSTM: the activated gates ``[i, f, g, o]`` (``4 * hidden`` columns);
- GRU: ``[r, z, n, hx, hn + b_hn]`` (``5 * hidden`` columns).

Autograd calls the backward rules when grad mode is off in backward (the
usual ``loss.backward()``); with ``create_graph=True`` it calls
``_thnn_differentiable_*_cell_backward``, which torch decomposes into ops
lowered elsewhere. ``nn.RNN`` needs no fused op (``rnn_tanh``/``rnn_relu``
are ``linear`` and an activation). A missing bias is zero, and the bias
gradients are the gate gradients summed over the batch (absent without bias).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from lazytpu.lowering.reduction import upcast
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _gates(input_gates, hidden_gates, input_bias, hidden_bias, parts: int):
    """The input and hidden gate pre-activations, biased, each split into ``parts`` blocks."""
    x, h = upcast(input_gates), upcast(hidden_gates)
    if input_bias is not None:
        x, h = x + upcast(input_bias), h + upcast(hidden_bias)
    return jnp.split(x, parts, axis=1), jnp.split(h, parts, axis=1)


def _bias_grads(has_bias: bool, *gate_grads) -> tuple:
    """Each gate gradient summed over the batch, in float32 for halves (``sum(0)``), when there is a bias."""
    return tuple(jnp.sum(upcast(g), axis=0) for g in gate_grads) if has_bias else ()


@lowering(aten._thnn_fused_lstm_cell.default)
def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """``(hy, cy, workspace)`` (Note [Fused RNN cells])."""
    x, h = _gates(input_gates, hidden_gates, input_bias, hidden_bias, 4)
    i, f, o = (jax.nn.sigmoid(x[k] + h[k]) for k in (0, 1, 3))
    g = jnp.tanh(x[2] + h[2])
    cy = f * upcast(cx) + i * g
    hy = o * jnp.tanh(cy)
    return hy, cy, jnp.concatenate([i, f, g, o], axis=1)


@lowering(aten._thnn_fused_lstm_cell_backward_impl.default)
def fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """``(grad_gates, grad_cx, grad_bias)``; a missing output gradient is zero (Note [Fused RNN cells])."""
    dtype = workspace.dtype
    i, f, g, o = jnp.split(upcast(workspace), 4, axis=1)
    go = 0.0 if grad_hy is None else upcast(grad_hy)
    gc = 0.0 if grad_cy is None else upcast(grad_cy)
    tanh_cy = jnp.tanh(upcast(cy))
    grad_c = go * o * (1 - tanh_cy * tanh_cy) + gc
    grad_gates = jnp.concatenate(
        [
            grad_c * g * (1 - i) * i,
            grad_c * upcast(cx) * (1 - f) * f,
            grad_c * i * (1 - g * g),
            go * tanh_cy * (1 - o) * o,
        ],
        axis=1,
    ).astype(dtype)
    return (grad_gates, grad_c * f, *_bias_grads(has_bias, grad_gates))


@lowering(aten._thnn_fused_gru_cell.default)
def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """``(hy, workspace)`` (Note [Fused RNN cells])."""
    x, h = _gates(input_gates, hidden_gates, input_bias, hidden_bias, 3)
    r = jax.nn.sigmoid(x[0] + h[0])
    z = jax.nn.sigmoid(x[1] + h[1])
    n = jnp.tanh(x[2] + r * h[2])
    prev = upcast(hx)
    hy = n + z * (prev - n)
    return hy, jnp.concatenate([r, z, n, prev, h[2]], axis=1)


@lowering(aten._thnn_fused_gru_cell_backward.default)
def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    """``(grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)``
    (Note [Fused RNN cells])."""
    dtype = workspace.dtype
    r, z, n, hx, hn = jnp.split(upcast(workspace), 5, axis=1)
    go = upcast(grad_hy)
    grad_z = go * (hx - n) * (1 - z) * z
    grad_n = go * (1 - z) * (1 - n * n)
    grad_r = grad_n * hn * (1 - r) * r
    grad_input = jnp.concatenate([grad_r, grad_z, grad_n], axis=1).astype(dtype)
    grad_hidden = jnp.concatenate([grad_r, grad_z, grad_n * r], axis=1).astype(dtype)
    return (grad_input, grad_hidden, go * z, *_bias_grads(has_bias, grad_input, grad_hidden))
