"""Steady training loops compile nothing after warm-up (issue: steady state).

Both an MLP and a small transformer, trained with AdamW and an LR scheduler
that changes the learning rate every step, with and without a host read
(`.item()`) per step: after the warm-up steps the number of compiled programs
stays exactly constant, and each step runs the same programs (one, or its
three segments: Note [Step segments] in lazytpu/engine.py).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import STEP_PROGRAMS

import lazytpu


class TinyTransformer(torch.nn.Module):
    """Decoder-only: embedding, 2 blocks of causal self-attention + MLP."""

    def __init__(self, vocab=50, width=32, heads=4, layers=2, seq=16):
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, width)
        self.pos = torch.nn.Parameter(torch.randn(seq, width) * 0.02)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict(
                {
                    "ln1": torch.nn.LayerNorm(width),
                    "qkv": torch.nn.Linear(width, 3 * width),
                    "proj": torch.nn.Linear(width, width),
                    "ln2": torch.nn.LayerNorm(width),
                    "fc": torch.nn.Linear(width, 4 * width),
                    "out": torch.nn.Linear(4 * width, width),
                }
            )
            for _ in range(layers)
        )
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, tokens):
        b, t = tokens.shape
        x = self.embed(tokens) + self.pos[:t]
        mask = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
        for blk in self.blocks:
            q, k, v = blk["qkv"](blk["ln1"](x)).chunk(3, dim=-1)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            att = att.masked_fill(~mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, -1)
            x = x + blk["proj"](y)
            x = x + blk["out"](F.gelu(blk["fc"](blk["ln2"](x))))
        return self.head(x)


def _mlp_setup():
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 5)).to("tpu")
    x, y = torch.randn(16, 20).to("tpu"), torch.randint(0, 5, (16,)).to("tpu")
    return model, (lambda: F.cross_entropy(model(x), y))


def _transformer_setup():
    model = TinyTransformer().to("tpu")
    tokens = torch.randint(0, 50, (4, 16)).to("tpu")
    return model, (lambda: F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()))


@pytest.mark.parametrize("setup", [_mlp_setup, _transformer_setup], ids=["mlp", "transformer"])
@pytest.mark.parametrize("read_loss", [True, False], ids=["item", "no_item"])
def test_compiles_nothing_after_warmup(setup, read_loss):
    # Start from no compiled program and no specialization (a test that ran the same model before
    # would have done this warm-up already): step 1 makes AdamW's state, step 2 is the first
    # update of the steady structure, with its numbers compiled in; step 3 lifts those that
    # changed (the learning rate, the bias corrections: Note [Scalar specialization]).
    lazytpu.runtime.clear_caches()
    torch.manual_seed(0)
    model, loss_fn = setup()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))  # a new lr every step
    compiled, executed = [], []
    for _ in range(8):
        before = lazytpu.metrics.snapshot()
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        opt.step()
        sched.step()
        if read_loss:
            loss.item()
        after = lazytpu.metrics.snapshot()
        compiled.append(after["programs_compiled"] - before["programs_compiled"])
        executed.append(after["programs_executed"] - before["programs_executed"])
    assert compiled[4:] == [0] * 4, compiled
    assert executed[3:] == [STEP_PROGRAMS] * 5, executed  # the step's programs (Note [Step segments])
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}


@pytest.mark.parametrize("read_loss", [True, False], ids=["item", "no_item"])
def test_stateless_loop_compiles_one_program_from_its_first_step(read_loss):
    """After a sync with nothing pending (the setup's ``synchronize``), the first
    step records its roots in the same order as every later step (Note [Deterministic
    roots]), so an SGD loop (no optimizer state to create) compiles once."""
    torch.manual_seed(0)
    model, loss_fn = _mlp_setup()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.tpu.synchronize()
    torch.tpu.synchronize()  # a second sync: nothing pending at all
    lazytpu.runtime.clear_caches()  # each program of the loop counts, whatever ran before
    before = lazytpu.metrics.snapshot()["programs_compiled"]
    for _ in range(4):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        loss.backward()
        opt.step()
        if read_loss:
            loss.item()
    assert lazytpu.metrics.snapshot()["programs_compiled"] - before == STEP_PROGRAMS


# In-place ops take a fast path (the functional node bound straight into the
# target's storage) when the target owns its storage with the result's layout;
# otherwise (a view, a dtype or layout mismatch) the general write path runs.
_INPLACE_CASES = {
    "same layout": (lambda: torch.randn(4, 5), lambda t, o: t.mul_(o).add_(1.5)),
    "broadcast operand": (lambda: torch.randn(4, 5), lambda t, o: t.addcmul_(o[0], o[1], value=-0.5)),
    "view target": (lambda: torch.randn(4, 5), lambda t, o: t[1:3].lerp_(o[1:3], 0.25)),
    "transposed target": (lambda: torch.randn(5, 4).t(), lambda t, o: t.addcdiv_(o, o.abs() + 1, value=2.0)),
    "int target, float result": (lambda: torch.arange(20).reshape(4, 5), lambda t, o: t.add_(3)),
}


@pytest.mark.parametrize("case", list(_INPLACE_CASES))
def test_inplace_ops_match_cpu_and_record_no_extra_tensor(case):
    make, op = _INPLACE_CASES[case]
    gen = torch.Generator().manual_seed(0)
    other = torch.randn(4, 5, generator=gen)
    for _ in range(2):  # the second call runs from the cached plans
        cpu = make()
        tpu = cpu.clone().to("tpu") if cpu.is_contiguous() else cpu.t().clone().to("tpu").t()
        expected = op(cpu, other)
        got = op(tpu, other.to("tpu"))
        torch.testing.assert_close(got.cpu(), expected)
        torch.testing.assert_close(tpu.cpu(), cpu)
    t = torch.randn(6, device="tpu")
    t.mul_(2.0).add_(1.0)  # plans made
    lazytpu.sync()
    graph = lazytpu.engine.context(0).graph
    storage, n_storages = t._lt_storage, len(graph.storages)
    t.mul_(2.0).add_(1.0)
    assert t._lt_storage is storage and len(graph.storages) == n_storages  # no tensor in between


def test_views_are_planned_once():
    from lazytpu.frontend.routes import views

    x = torch.randn(3, 4, device="tpu")
    x.t()
    planned = len(views._VIEW_PLANS)
    for _ in range(3):
        y = x.t()
    assert len(views._VIEW_PLANS) == planned
    assert y.shape == (4, 3) and y.stride() == (1, 4) and y._lt_storage is x._lt_storage
    torch.testing.assert_close(y.cpu(), x.cpu().t())
