"""Hand-written JAX equivalents of (a), (b), (c), each step under one ``jax.jit``.

Same math, same shapes, same initial numbers (taken from the torch workload's
``init_state``), float32 throughout (lazytpu turns on ``jax_enable_x64``, so
every array here is created with an explicit dtype). Training steps donate the
parameters and optimizer state. Each ``JaxWorkload.step()`` returns the loss
(not waited on) and keeps the new state; ``wait()`` blocks on everything the
step produced.

The training steps take ``grads=True`` to also return the step's gradients,
as the torch step leaves them in ``.grad`` (``python -m benchmarks.floor``
prices that; the suite times the step without them).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import workloads as W

F32 = jnp.float32


def _arr(t) -> jax.Array:
    """A torch CPU tensor as a device array (float32 stays float32, ints become int32)."""
    a = t.detach().cpu().numpy()
    if a.dtype.kind in "iu":
        a = a.astype(np.int32)
    return jnp.asarray(a)


def _linear(x, w, b=None):
    """torch ``nn.Linear``: weight is (out, in)."""
    y = x @ w.T
    return y if b is None else y + b


def _cross_entropy(logits, labels):
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=-1))


def _layer_norm(x, gamma, beta, eps):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * gamma + beta


@dataclasses.dataclass
class JaxWorkload:
    """A jitted step and the state it threads through."""

    name: str
    jitted: Any  # the jax.jit function (``_cache_size()`` counts its compiles)
    run: Callable[[], jax.Array]  # one step: updates the state, returns the loss
    outputs: Callable[[], Any]  # everything the last step produced
    args: Callable[[], tuple] | None = None  # the next step's arguments (training steps)

    def step(self) -> jax.Array:
        return self.run()

    def wait(self) -> None:
        jax.block_until_ready(self.outputs())


# ---------------------------------------------------------------------------
# (a) MLP + SGD
# ---------------------------------------------------------------------------
def _mlp_loss(params, x, y):
    h = x
    for i, (w, b) in enumerate(params):
        h = _linear(h, w, b)
        if i < len(params) - 1:
            h = jax.nn.relu(h)
    return _cross_entropy(h, y)


def mlp(init: dict[str, Any], lr: float = W.MLP_LR, grads: bool = False) -> JaxWorkload:
    linears = [k.split(".")[0] for k in init if k.endswith(".weight")]  # Sequential indices of the Linears
    params = [(_arr(init[f"{i}.weight"]), _arr(init[f"{i}.bias"])) for i in linears]
    x, y = _arr(init["x"]), _arr(init["y"])

    def _step(params, x, y):
        loss, g = jax.value_and_grad(_mlp_loss)(params, x, y)
        new = jax.tree_util.tree_map(lambda p, g: p - lr * g, params, g)
        return new, loss, (g if grads else None)

    step = jax.jit(_step, donate_argnums=(0,))
    state = {"params": params, "loss": None, "grads": None}

    def run():
        state["grads"] = None  # as ``zero_grad(set_to_none=True)``
        state["params"], state["loss"], state["grads"] = step(state["params"], x, y)
        return state["loss"]

    outputs = lambda: (state["params"], state["loss"], state["grads"])  # noqa: E731
    return JaxWorkload(f"mlp_b{x.shape[0]}", step, run, outputs, lambda: (state["params"], x, y))


# ---------------------------------------------------------------------------
# (b) elementwise chain + layer_norm, forward and backward
# ---------------------------------------------------------------------------
def chain(x, w, b, gamma, beta):
    """:func:`benchmarks.workloads.chain`, op for op."""
    y = x * w + b
    y = jnp.tanh(y)
    y = y * jax.nn.sigmoid(y)
    y = y + 0.5 * x
    y = jnp.exp(-jnp.abs(y))
    y = y * y - y
    y = jax.nn.gelu(y, approximate=False)
    y = jnp.sqrt(y * y + 1e-3)
    y = y / (1.0 + x * x)
    y = jnp.clip(y, -3.0, 3.0)
    y = _layer_norm(y, gamma, beta, W.CHAIN_EPS)
    return jnp.mean(y * y)


def elementwise_chain(init: dict[str, Any]) -> JaxWorkload:
    args = tuple(_arr(init[k]) for k in ("x", "w", "b", "gamma", "beta"))
    step = jax.jit(jax.value_and_grad(chain, argnums=(0, 1, 2, 3, 4)))
    state = {"out": None}

    def run():
        state["out"] = step(*args)
        return state["out"][0]

    return JaxWorkload(f"chain_{args[0].shape[0]}", step, run, lambda: state["out"])


# ---------------------------------------------------------------------------
# (c) decoder-only transformer + AdamW
# ---------------------------------------------------------------------------
def _gpt_params(init: dict[str, Any]) -> dict[str, Any]:
    layers = []
    i = 0
    while f"blocks.layers.{i}.linear1.weight" in init:
        p = f"blocks.layers.{i}."
        names = (
            "self_attn.in_proj_weight self_attn.in_proj_bias self_attn.out_proj.weight self_attn.out_proj.bias "
            "linear1.weight linear1.bias linear2.weight linear2.bias norm1.weight norm1.bias norm2.weight norm2.bias"
        ).split()
        layers.append({n: _arr(init[p + n]) for n in names})
        i += 1
    return {
        "tok": _arr(init["tok.weight"]),
        "pos": _arr(init["pos"]),
        "layers": layers,
        "norm_w": _arr(init["norm.weight"]),
        "norm_b": _arr(init["norm.bias"]),
        "head": _arr(init["head.weight"]),
    }


def _attention(x, lp, heads: int, mask):
    batch, seq, width = x.shape
    d = width // heads
    qkv = _linear(x, lp["self_attn.in_proj_weight"], lp["self_attn.in_proj_bias"])
    q, k, v = jnp.split(qkv, 3, axis=-1)

    def split(t):
        return t.reshape(batch, seq, heads, d).transpose(0, 2, 1, 3)

    q, k, v = split(q), split(k), split(v)
    scores = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(d)) + mask
    out = jax.nn.softmax(scores, axis=-1) @ v
    out = out.transpose(0, 2, 1, 3).reshape(batch, seq, width)
    return _linear(out, lp["self_attn.out_proj.weight"], lp["self_attn.out_proj.bias"])


def _gpt_loss(params, inp, tgt, heads: int):
    seq = inp.shape[1]
    mask = jnp.where(jnp.tril(jnp.ones((seq, seq), dtype=bool)), 0.0, -jnp.inf).astype(F32)
    h = params["tok"][inp] + params["pos"][:seq]
    eps = W.GPT_NORM_EPS
    for lp in params["layers"]:  # pre-norm blocks, as nn.TransformerEncoderLayer(norm_first=True)
        h = h + _attention(_layer_norm(h, lp["norm1.weight"], lp["norm1.bias"], eps), lp, heads, mask)
        ff = _layer_norm(h, lp["norm2.weight"], lp["norm2.bias"], eps)
        ff = _linear(
            jax.nn.gelu(_linear(ff, lp["linear1.weight"], lp["linear1.bias"]), approximate=False),
            lp["linear2.weight"],
            lp["linear2.bias"],
        )
        h = h + ff
    logits = _linear(_layer_norm(h, params["norm_w"], params["norm_b"], eps), params["head"])
    return _cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))


def _adamw(params, grads, m, v, t, lr, betas, eps, weight_decay):
    """torch.optim.AdamW (non-amsgrad, not maximize), with step count ``t`` >= 1 a traced float."""
    b1, b2 = betas
    bc1 = 1.0 - b1**t
    bc2 = 1.0 - b2**t

    def one(p, g, m_, v_):
        p = p * (1.0 - lr * weight_decay)
        m_ = b1 * m_ + (1.0 - b1) * g
        v_ = b2 * v_ + (1.0 - b2) * g * g
        denom = jnp.sqrt(v_) / jnp.sqrt(bc2) + eps
        return p - (lr / bc1) * m_ / denom, m_, v_

    out = jax.tree_util.tree_map(one, params, grads, m, v)
    tdef = jax.tree_util.tree_structure(params)
    leaves = tdef.flatten_up_to(out)
    new_p = tdef.unflatten([x[0] for x in leaves])
    new_m = tdef.unflatten([x[1] for x in leaves])
    new_v = tdef.unflatten([x[2] for x in leaves])
    return new_p, new_m, new_v


def transformer(init: dict[str, Any], opt: dict = W.ADAMW, grads: bool = False) -> JaxWorkload:
    cfg = init["config"]
    params = _gpt_params(init)
    inp, tgt = _arr(init["inp"]), _arr(init["tgt"])
    heads = cfg["heads"]

    def _step(params, m, v, t, inp, tgt):
        loss, g = jax.value_and_grad(_gpt_loss)(params, inp, tgt, heads)
        params, m, v = _adamw(params, g, m, v, t, opt["lr"], opt["betas"], opt["eps"], opt["weight_decay"])
        return params, m, v, loss, (g if grads else None)

    step = jax.jit(_step, donate_argnums=(0, 1, 2))
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    state = {"params": params, "m": zeros, "v": jax.tree_util.tree_map(jnp.zeros_like, params), "t": 0}
    state.update(loss=None, grads=None)

    def run():
        state["t"] += 1
        t = jnp.asarray(state["t"], dtype=F32)
        state["grads"] = None  # as ``zero_grad(set_to_none=True)``
        state["params"], state["m"], state["v"], state["loss"], state["grads"] = step(
            state["params"], state["m"], state["v"], t, inp, tgt
        )
        return state["loss"]

    outputs = ("params", "m", "v", "loss", "grads")

    def args():
        t = jnp.asarray(state["t"] + 1, dtype=F32)
        return state["params"], state["m"], state["v"], t, inp, tgt

    return JaxWorkload("transformer", step, run, lambda: tuple(state[k] for k in outputs), args)


# Same keys as ``benchmarks.workloads.WORKLOADS``.
BUILDERS: dict[str, Callable[[dict[str, Any]], JaxWorkload]] = {
    "mlp_b32": mlp,
    "mlp_b256": mlp,
    "chain": elementwise_chain,
    "transformer": transformer,
}
