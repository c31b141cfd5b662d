"""The benchmark workloads, written once in plain ``torch`` (any device).

Every workload is a factory ``build(device, **sizes) -> Workload`` whose
``step()`` runs one training step (or one forward+backward) and returns the
loss as an unsynced tensor. The runner adds the wait that makes a timing
honest; ``tests/test_bench_structure.py`` imports these same factories at
small sizes.

Parameters start from ``torch.manual_seed(SEED)`` on CPU and are then moved to
the device, so every variant (and the hand-written JAX versions in
``benchmarks.jax_workloads``, which take ``Workload.init_state``) starts from
the same numbers; the first step's loss must agree across variants.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import subclass

SEED = 0


@dataclasses.dataclass
class Workload:
    """One workload instance on one device.

    Attributes:
        name: the workload's table name (e.g. ``"mlp_b32"``).
        step: runs one step; returns the loss (a 0-d tensor, not synced).
        init_state: CPU copies of the initial parameters and inputs, by name
            (what the JAX version starts from).
        model: the ``nn.Module`` if there is one (torch.compile wraps parts of it).
        compile: ``compile(compiler, optimizer=False)`` rebuilds ``step`` with the
            forward (+ its backward) under ``compiler`` (``torch.compile`` or a
            partial of it); with ``optimizer=True`` also ``optimizer.step()``
            (else the optimizer stays eager).
    """

    name: str
    step: Callable[[], torch.Tensor]
    init_state: dict[str, Any]
    model: nn.Module | None = None
    compile: Callable[..., None] | None = None


def _cpu_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def to_device(value, device: str):
    """``value.to(device)``, where ``device`` may also be the forwarding floor's
    pseudo device (Note [Forwarding floor] in benchmarks.subclass)."""
    if device == subclass.DEVICE:
        return subclass.wrap(value)
    return value.to(device)


def _optimizer_step(loss_of: Callable, inputs: tuple, opt) -> tuple[Callable, Callable]:
    """A training step (zero_grad, ``loss_of(*inputs)``, backward, ``opt.step()``) and its
    ``compile(compiler, optimizer=False)`` (the ``Workload.compile`` contract)."""
    fn = [loss_of]
    opt_step = [opt.step]

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = fn[0](*inputs)
        loss.backward()
        opt_step[0]()
        return loss.detach()

    def compile_(compiler: Callable, optimizer: bool = False) -> None:
        fn[0] = compiler(loss_of)
        if optimizer:
            opt_step[0] = compiler(opt.step)

    return step, compile_


# ---------------------------------------------------------------------------
# (a) MLP 784-1024-1024-10, SGD
# ---------------------------------------------------------------------------
MLP_SIZES = (784, 1024, 1024, 10)
MLP_LR = 0.01


def make_mlp(sizes=MLP_SIZES) -> nn.Sequential:
    torch.manual_seed(SEED)
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def mlp(device: str, batch: int = 32, sizes=MLP_SIZES) -> Workload:
    """(a) An MLP training step: cross-entropy, ``SGD(lr=0.01)``, set_to_none zero_grad."""
    model = make_mlp(sizes)
    init = _cpu_state(model)
    gen = torch.Generator().manual_seed(SEED + 1)
    x_cpu = torch.randn(batch, sizes[0], generator=gen)
    y_cpu = torch.randint(0, sizes[-1], (batch,), generator=gen)
    init.update(x=x_cpu.clone(), y=y_cpu.clone())
    model = to_device(model, device)
    x, y = to_device(x_cpu, device), to_device(y_cpu, device)
    opt = torch.optim.SGD(model.parameters(), lr=MLP_LR)
    loss_fn = [lambda: F.cross_entropy(model(x), y)]
    opt_step = [opt.step]

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn[0]()
        loss.backward()
        opt_step[0]()
        return loss.detach()

    def compile_(compiler: Callable, optimizer: bool = False) -> None:
        compiled = compiler(lambda a, b: F.cross_entropy(model(a), b))
        loss_fn[0] = lambda: compiled(x, y)
        if optimizer:
            opt_step[0] = compiler(opt.step)

    return Workload(f"mlp_b{batch}", step, init, model, compile_)


# ---------------------------------------------------------------------------
# (b) elementwise/normalization chain: 20 pointwise ops + layer_norm, fwd+bwd
# ---------------------------------------------------------------------------
CHAIN_EPS = 1e-5


def chain(x, w, b, gamma, beta):
    """20 pointwise ops, then layer_norm over the last dim, then a mean-square loss."""
    y = x * w + b  # 2 ops (mul, add)
    y = torch.tanh(y)  # 3
    y = y * torch.sigmoid(y)  # 5
    y = y + 0.5 * x  # 7
    y = torch.exp(-torch.abs(y))  # 10
    y = y * y - y  # 12
    y = F.gelu(y)  # 13
    y = torch.sqrt(y * y + 1e-3)  # 16
    y = y / (1.0 + x * x)  # 19
    y = torch.clamp(y, -3.0, 3.0)  # 20
    y = F.layer_norm(y, (y.shape[-1],), gamma, beta, eps=CHAIN_EPS)
    return (y * y).mean()


def elementwise_chain(device: str, n: int = 1024) -> Workload:
    """(b) Forward and backward of :func:`chain` on an ``n x n`` input; gradients
    for the input and all four parameter vectors (set to None before each step)."""
    gen = torch.Generator().manual_seed(SEED + 2)
    init = {
        "x": torch.randn(n, n, generator=gen),
        "w": 1.0 + 0.1 * torch.randn(n, generator=gen),
        "b": 0.1 * torch.randn(n, generator=gen),
        "gamma": 1.0 + 0.1 * torch.randn(n, generator=gen),
        "beta": 0.1 * torch.randn(n, generator=gen),
    }
    leaves = [to_device(init[k].clone(), device).requires_grad_(True) for k in ("x", "w", "b", "gamma", "beta")]
    fn = [chain]

    def step() -> torch.Tensor:
        for t in leaves:
            t.grad = None
        loss = fn[0](*leaves)
        loss.backward()
        return loss.detach()

    def compile_(compiler: Callable, optimizer: bool = False) -> None:
        fn[0] = compiler(chain)  # no optimizer

    return Workload(f"chain_{n}", step, init, None, compile_)


# ---------------------------------------------------------------------------
# (c) small decoder-only transformer, AdamW
# ---------------------------------------------------------------------------
GPT_DEFAULTS = dict(vocab=256, width=128, heads=4, layers=2, seq=64, ff=512)
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
GPT_NORM_EPS = 1e-5


class TinyGPT(nn.Module):
    """Token + learned position embeddings, pre-norm ``nn.TransformerEncoderLayer``
    blocks under a causal mask (GELU, no dropout), final LayerNorm, untied head."""

    def __init__(self, vocab: int, width: int, heads: int, layers: int, seq: int, ff: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(0.02 * torch.randn(seq, width))
        layer = nn.TransformerEncoderLayer(
            width,
            heads,
            ff,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
            layer_norm_eps=GPT_NORM_EPS,
        )
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width, eps=GPT_NORM_EPS)
        self.head = nn.Linear(width, vocab, bias=False)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.tok(idx) + self.pos[: idx.shape[1]]
        h = self.blocks(h, mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


def transformer(device: str, batch: int = 8, **sizes) -> Workload:
    """(c) A next-token training step of :class:`TinyGPT` with ``AdamW``."""
    cfg = {**GPT_DEFAULTS, **sizes}
    torch.manual_seed(SEED)
    model = TinyGPT(**cfg)
    init = _cpu_state(model)
    gen = torch.Generator().manual_seed(SEED + 3)
    tokens = torch.randint(0, cfg["vocab"], (batch, cfg["seq"] + 1), generator=gen)
    init.update(inp=tokens[:, :-1].clone(), tgt=tokens[:, 1:].clone(), config=cfg)
    model = to_device(model, device)
    inp, tgt = to_device(tokens[:, :-1], device), to_device(tokens[:, 1:], device)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)

    def loss_of(a, b):
        logits = model(a)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b.reshape(-1))

    step, compile_ = _optimizer_step(loss_of, (inp, tgt), opt)
    return Workload("transformer", step, init, model, compile_)


# ---------------------------------------------------------------------------
# (e) transformers models: what users train (issue 21)
# ---------------------------------------------------------------------------
# Small configs of three families, random weights, dropout 0 (every variant
# computes the same numbers): a training step with AdamW, the loss read every step.
HF_DEFAULTS = dict(vocab=256, width=128, layers=2, heads=4, seq=32, ff=256)
HF_FAMILIES = ("llama", "gpt2", "bert")


def _hf_config(family: str, cfg: dict):
    import transformers

    v, w, n, h, ff = cfg["vocab"], cfg["width"], cfg["layers"], cfg["heads"], cfg["ff"]
    if family == "llama":
        return transformers.LlamaConfig(
            vocab_size=v, hidden_size=w, intermediate_size=ff, num_hidden_layers=n, num_attention_heads=h,
            num_key_value_heads=max(1, h // 2), max_position_embeddings=max(64, cfg["seq"]),
        )  # fmt: skip
    if family == "gpt2":
        return transformers.GPT2Config(
            vocab_size=v, n_embd=w, n_inner=ff, n_layer=n, n_head=h, n_positions=max(64, cfg["seq"]),
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
    return transformers.BertConfig(
        vocab_size=v, hidden_size=w, intermediate_size=ff, num_hidden_layers=n, num_attention_heads=h,
        max_position_embeddings=max(64, cfg["seq"]), hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip


def hf_model(device: str, family: str = "llama", batch: int = 4, **sizes) -> Workload:
    """(e) A training step of a small ``transformers`` model (``family``: llama
    and gpt2 causal LM, bert masked LM on every token) with ``AdamW``."""
    import transformers

    cfg = {**HF_DEFAULTS, **sizes}
    config = _hf_config(family, cfg)
    torch.manual_seed(SEED)
    if family == "bert":
        model = transformers.BertForMaskedLM(config)
    else:
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.train()
    init = _cpu_state(model)
    gen = torch.Generator().manual_seed(SEED + 4)
    ids_cpu = torch.randint(0, cfg["vocab"], (batch, cfg["seq"]), generator=gen)
    init.update(input_ids=ids_cpu.clone(), config=cfg)
    model = to_device(model, device)
    ids = to_device(ids_cpu, device)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)

    no_cache = {} if family == "bert" else {"use_cache": False}  # training keeps no KV cache

    def loss_of(a):
        return model(input_ids=a, labels=a, **no_cache).loss

    step, compile_ = _optimizer_step(loss_of, (ids,), opt)
    return Workload(family, step, init, model, compile_)


# ---------------------------------------------------------------------------
# (d) per-op recording microbenchmark
# ---------------------------------------------------------------------------
def op_chain(x: torch.Tensor, n_ops: int) -> torch.Tensor:
    """``n_ops`` tiny elementwise ops (alternating add/mul with Python scalars:
    the same op signature every time, so recording hits every cache)."""
    y = x
    for i in range(n_ops):
        y = y + 1.0 if i % 2 == 0 else y * 0.5
    return y


# Tiny sizes with the same structure (the regression test and ``--small`` use them).
SMALL_SIZES: dict[str, dict] = {
    "mlp_b32": dict(batch=4, sizes=(16, 32, 32, 4)),
    "mlp_b256": dict(batch=8, sizes=(16, 32, 32, 4)),
    "chain": dict(n=32),
    "transformer": dict(batch=2, vocab=16, width=16, heads=2, layers=2, seq=8, ff=32),
    **{f: dict(family=f, batch=2, vocab=32, width=16, heads=2, layers=1, seq=8, ff=32) for f in HF_FAMILIES},
}

# The workloads the suite times, by table name: (factory, kwargs, description).
WORKLOADS: dict[str, tuple[Callable[..., Workload], dict, str]] = {
    "mlp_b32": (mlp, dict(batch=32), "(a) MLP 784-1024-1024-10 training step, batch 32, SGD"),
    "mlp_b256": (mlp, dict(batch=256), "(a) MLP 784-1024-1024-10 training step, batch 256, SGD"),
    "chain": (elementwise_chain, dict(n=1024), "(b) 20 pointwise ops + layer_norm on 1024x1024, fwd+bwd"),
    "transformer": (transformer, dict(batch=8), "(c) decoder-only transformer 2x128, 4 heads, seq 64, batch 8, AdamW"),
    "llama": (hf_model, dict(family="llama"), "(e) transformers Llama 2x128, 4 heads (2 KV), seq 32, batch 4, AdamW"),
    "gpt2": (hf_model, dict(family="gpt2"), "(e) transformers GPT-2 2x128, 4 heads, seq 32, batch 4, AdamW"),
    "bert": (hf_model, dict(family="bert"), "(e) transformers BERT masked LM 2x128, 4 heads, seq 32, batch 4, AdamW"),
}
