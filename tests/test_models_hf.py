"""Hugging Face ``transformers`` models on ``tpu``: training parity and greedy generation.

Models are built from small configs (2 layers, width 64, fixed seed, random
weights: nothing is downloaded) and run unchanged; the CPU run of the same
model is the reference. Dropout probabilities are 0 for parity: CPU and
``tpu`` draw masks from different generators.

``model.to("tpu")`` keeps tied weights tied (GPT-2's ``lm_head``/``wte``,
BERT's decoder weight and bias), as on CUDA: no ``model.tie_weights()`` is
needed after the move (Note [Module conversion] in lazytpu/device/module_conversion.py).
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tolerance
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Trainer,
    TrainingArguments,
)
from transformers.utils import logging as hf_logging

import lazytpu

hf_logging.set_verbosity_error()

VOCAB = 96
SEQ = 16


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_embd=64,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=64,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=1,
    )
    return GPT2LMHeadModel(config)


# a Llama-like decoder's sizes (Mixtral's too)
DECODER = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
DECODER |= {"vocab_size": VOCAB, "max_position_embeddings": 64, "bos_token_id": 0, "eos_token_id": 1}


def llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(intermediate_size=128, **DECODER))


def bert() -> torch.nn.Module:
    torch.manual_seed(0)
    config = BertConfig(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    return BertForMaskedLM(config)


MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert}


def _batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(2, VOCAB, (2, SEQ), generator=gen)
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, SEQ - 4 :] = 0  # right padding in the second row
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _train(model, device: str, steps: int = 5):
    """Losses of ``steps`` AdamW steps and the last step's gradients."""
    if device == "tpu":
        model.to("tpu")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = {k: v.to(device) for k, v in _batch().items()}
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return torch.stack([x.cpu() for x in losses]), grads


@pytest.mark.parametrize("name, mode", [("gpt2", "defer"), ("llama", "defer"), ("bert", "defer"), ("llama", "strict")])
def test_training_matches_cpu(name, mode):
    model = MODELS[name]()
    assert model.config._attn_implementation == "sdpa"
    cpu_losses, cpu_grads = _train(copy.deepcopy(model), "cpu")
    lazytpu.metrics.reset()
    with torch.tpu.set_eager_mode(mode):
        tpu_losses, tpu_grads = _train(copy.deepcopy(model), "tpu")
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=1e-4, atol=0)
    assert cpu_losses[-1] < cpu_losses[0]
    assert tpu_grads.keys() == cpu_grads.keys()
    for key, grad in cpu_grads.items():
        torch.testing.assert_close(tpu_grads[key], grad, **tolerance(torch.float32), msg=key)


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_gradient_checkpointing_with_dropout_gives_the_gradients_without_it(reentrant):
    """transformers' ``gradient_checkpointing_enable`` (reentrant by default):
    the recomputed dropout masks are the forward's (Note [Recomputed random
    ops]), across the sync at the step's first segment."""
    model = gpt2()
    model.config.resid_pdrop = model.config.embd_pdrop = model.config.attn_pdrop = 0.3
    model = GPT2LMHeadModel(model.config)
    checkpointed = copy.deepcopy(model)
    checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    grads = []
    for m in (model, checkpointed):
        torch.manual_seed(2)
        _, grad = _train(m, "tpu", steps=1)
        grads.append(grad)
    assert grads[0].keys() == grads[1].keys()
    for key, grad in grads[0].items():
        torch.testing.assert_close(grads[1][key], grad, rtol=1e-5, atol=1e-6, msg=key)


def test_moe_training_matches_cpu_on_the_device():
    """Mixtral's experts as transformers runs them on an accelerator: an int32
    ``histc`` of the tokens per expert (Note [CUDA's histc]) and
    ``torch._grouped_mm`` (lowered as ragged products); both raised or ran on
    CPU. The router's auxiliary loss is in the loss."""
    torch.manual_seed(0)
    config = MixtralConfig(
        intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True, **DECODER
    )
    model = MixtralForCausalLM(config)
    cpu_losses, cpu_grads = _train(copy.deepcopy(model), "cpu", steps=2)
    lazytpu.metrics.reset()
    tpu_losses, tpu_grads = _train(copy.deepcopy(model), "tpu", steps=2)
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {}
    torch.testing.assert_close(tpu_losses, cpu_losses, rtol=1e-4, atol=0)
    for key, grad in cpu_grads.items():
        torch.testing.assert_close(tpu_grads[key], grad, rtol=1e-4, atol=1e-5, msg=key)


def test_moe_compiles_in_float32_as_cpu_computes_it():
    """transformers sends a tpu MoE layer to ``torch._grouped_mm`` in every dtype; under
    ``torch.compile`` its fake tensors met torch's meta kernel, CUDA's, which refuses
    float32 (Note [Dynamo hooks] in lazytpu/compile/_dynamo_hooks.py)."""
    torch.manual_seed(0)
    model = MixtralForCausalLM(
        MixtralConfig(intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, **DECODER)
    )
    ids = torch.randint(3, VOCAB, (2, 7))
    with torch.no_grad():
        expected = model(ids).logits
        torch._dynamo.reset()
        got = torch.compile(model.to("tpu"), backend="tpu")(ids.to("tpu")).logits
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_record_fused_attention(name):
    """``F.scaled_dot_product_attention`` in the models is one op each way, not the math decomposition."""
    model = MODELS[name]().to("tpu")
    batch = {k: v.to("tpu") for k, v in _batch().items()}
    loss = model(**batch).loss
    forward = lazytpu.debug.pending_graph(loss)
    assert forward.count("aten._scaled_dot_product_efficient_attention.default") == 2  # 2 layers
    assert "aten._softmax.default" not in forward.split("_scaled_dot_product")[0]
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    backward = lazytpu.debug.pending_graph(*grads)
    assert backward.count("aten._scaled_dot_product_efficient_attention_backward.default") == 2


@pytest.mark.parametrize("name", sorted(MODELS))
def test_to_tpu_keeps_tied_weights(name):
    """The model keeps its very Parameter objects, so the names sharing one on CPU share it on ``tpu``."""
    model = MODELS[name]()
    before = dict(model.named_parameters(remove_duplicate=False))
    model.to("tpu")
    after = dict(model.named_parameters(remove_duplicate=False))
    assert after.keys() == before.keys()
    for key, param in after.items():
        assert param is before[key], key
        assert param.device.type == "tpu" and isinstance(param, torch.nn.Parameter), key
    if name == "gpt2":
        assert model.lm_head.weight is model.transformer.wte.weight
    if name == "bert":
        assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    tied = len(after) - len({id(p) for p in after.values()})
    assert tied == {"gpt2": 1, "llama": 0, "bert": 2}[name]


@pytest.mark.parametrize(
    "how", ["device_map", "device_map_dict", "cpu_offload", "disk_offload", "device_context", "default_device"]
)
def test_from_pretrained_straight_onto_the_device(tmp_path, how):
    """``from_pretrained(path, device_map="tpu")`` (accelerate places each weight), under ``with
    torch.device("tpu")`` or ``torch.set_default_device("tpu")``: every weight on tpu, CPU's logits."""
    model = llama()
    model.save_pretrained(tmp_path)
    ids = _batch()["input_ids"]
    if how == "device_map":
        loaded = LlamaForCausalLM.from_pretrained(tmp_path, device_map="tpu")
    elif how == "device_map_dict":
        loaded = LlamaForCausalLM.from_pretrained(tmp_path, device_map={"": "tpu:0"})
    elif how in ("cpu_offload", "disk_offload"):  # a layer's weights kept off the device, moved for its forward
        device_map = {"model.embed_tokens": 0, "model.layers.0": how.split("_")[0], "model.layers.1": 0}
        device_map |= {"model.norm": 0, "model.rotary_emb": 0, "lm_head": 0}  # the index: safetensors refuses "tpu:0"
        loaded = LlamaForCausalLM.from_pretrained(tmp_path, device_map=device_map, offload_folder=tmp_path / "off")
    elif how == "device_context":
        with torch.device("tpu", 0):
            loaded = LlamaForCausalLM.from_pretrained(tmp_path)
    else:
        torch.set_default_device("tpu")
        try:
            loaded = LlamaForCausalLM.from_pretrained(tmp_path)
        finally:
            torch.set_default_device(None)
    placed = {p.device.type for p in loaded.parameters()} | {b.device.type for b in loaded.buffers()}
    assert placed == ({"tpu", "meta"} if how.endswith("offload") else {"tpu"})  # offloaded: meta until used
    logits = loaded(ids.to("tpu")).logits.cpu()
    torch.testing.assert_close(logits, model(ids).logits, **tolerance(torch.float32))


# -- generation ----------------------------------------------------------------
#
# Note [Generation programs]: each greedy step of ``generate()`` ends in a
# host read (the stopping check), so each step is one program, and its shapes
# grow with the sequence (KV cache, ``input_ids``, attention mask): a 20-token
# generation compiles one program per step plus a few for the prompt (24 for
# GPT-2 here). A second generation of a prompt of the same length compiles
# nothing. Padding prompts on the left (masked pad tokens) to a bucket length
# extends that to every prompt length of the bucket: all of them record the
# very same programs. The price is a second host read per step (transformers
# checks whether the padding mask is all ones), so the first generation of a
# bucket compiles about two programs per token, the small one a few ops.
#
# With ``cache_implementation="static"`` the KV cache is padded to its final
# length, so every decode step runs the model on the same shapes, and
# transformers compiles the step with ``torch.compile(backend="tpu")``: the
# model is compiled twice per generation (prefill, decode step) instead of
# once per token. What still compiles per token is bookkeeping around the
# growing ``input_ids`` (programs of a few dozen ops).

NEW_TOKENS = 20
BUCKET = 16
GENERATE = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=1)


def _prompt(length: int, bucket: int | None = None) -> dict[str, torch.Tensor]:
    """A random prompt, left-padded with masked pad tokens to ``bucket`` when given."""
    gen = torch.Generator().manual_seed(length)
    ids = torch.randint(2, VOCAB, (1, length), generator=gen)
    if bucket is None:
        return {"input_ids": ids}
    pad = bucket - length
    ids = torch.cat([torch.full((1, pad), GENERATE["pad_token_id"]), ids], dim=1)
    mask = torch.cat([torch.zeros(1, pad, dtype=torch.long), torch.ones(1, length, dtype=torch.long)], dim=1)
    return {"input_ids": ids, "attention_mask": mask}


def _generate(model, prompt: dict, device: str, **options) -> tuple[torch.Tensor, dict]:
    """Generated ids (on CPU) and the metrics of the generation."""
    lazytpu.metrics.reset()
    out = model.generate(**{k: v.to(device) for k, v in prompt.items()}, **GENERATE, **options).cpu()
    return out, lazytpu.metrics.snapshot()


def test_greedy_generation_matches_cpu_gpt2():
    model = gpt2().eval()
    prompt = _prompt(8)
    expected, _ = _generate(model, prompt, "cpu")
    model.to("tpu")
    tokens, first = _generate(model, prompt, "tpu")
    assert torch.equal(tokens, expected)
    assert tokens.shape[1] == 8 + NEW_TOKENS
    assert first["cpu_fallbacks"] == {}
    # Note [Generation programs]
    assert first["programs_compiled"] <= NEW_TOKENS + 5
    again, second = _generate(model, prompt, "tpu")
    assert torch.equal(again, expected)
    assert second["programs_compiled"] == 0
    assert second["programs_executed"] == first["programs_executed"]


def test_greedy_generation_matches_cpu_llama_bucketed_prompts():
    model = llama().eval()
    prompts = [_prompt(5, BUCKET), _prompt(11, BUCKET)]
    expected = [_generate(model, p, "cpu")[0] for p in prompts]
    model.to("tpu")
    tokens, first = _generate(model, prompts[0], "tpu")
    assert torch.equal(tokens, expected[0])
    assert first["cpu_fallbacks"] == {}
    # two host reads per step in the first generation of a bucket (Note [Generation programs])...
    assert first["programs_compiled"] <= 2 * NEW_TOKENS + 6
    tokens, second = _generate(model, prompts[1], "tpu")
    assert torch.equal(tokens, expected[1])
    # ...and no compile at all for another prompt length of the bucket.
    assert second["programs_compiled"] == 0
    assert second["programs_executed"] == first["programs_executed"]


def _compiled(dump_dir, min_ops: int = 100) -> tuple[int, int]:
    """(lazy programs of at least ``min_ops`` ops, torch.compile graphs) compiled into ``dump_dir``."""
    sizes = [int(p.read_text().split()[1]) for p in dump_dir.glob("*.ir.txt")]
    return sum(n >= min_ops for n in sizes), len(list(dump_dir.glob("*.fx.py")))


def test_static_cache_generation_compiles_the_model_twice(tmp_path):
    model = gpt2().eval()
    prompt = _prompt(8)
    expected, _ = _generate(model, prompt, "cpu")
    model.to("tpu")
    with lazytpu._config.DUMP_DIR.override(str(tmp_path / "static")):
        tokens, stats = _generate(model, prompt, "tpu", cache_implementation="static")
    assert torch.equal(tokens, expected)
    assert stats["cpu_fallbacks"] == {}
    # the prefill, and one decode step for all 19 steps (Note [Generation programs])
    prefill, decode = _compiled(tmp_path / "static")
    assert prefill <= 1 and decode == 1


def test_a_llama_step_without_a_mask_is_three_programs():
    """With no attention mask, transformers reads a mask made from
    ``torch.arange`` in every forward (``find_packed_sequence_indices``): a
    constant read (Note [Constant reads] in lazytpu/engine_flush.py), so the
    forward is not cut there and a step is its three segments (Note [Step
    segments] in lazytpu/engine.py), with CPU's losses."""
    model = llama()
    ids = _batch()["input_ids"]
    losses = {}
    for device in ("cpu", "tpu"):
        m = copy.deepcopy(model).to(device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        x, per_step = ids.to(device), []
        for _ in range(4):
            before = lazytpu.metrics.snapshot()
            opt.zero_grad()
            loss = m(input_ids=x, labels=x, use_cache=False).loss
            loss.backward()
            opt.step()
            losses.setdefault(device, []).append(loss.item())
            after = lazytpu.metrics.snapshot()
            per_step.append(
                (
                    after["programs_executed"] - before["programs_executed"],
                    after["constant_reads"] - before["constant_reads"],
                )
            )
        if device == "tpu":
            assert per_step[2:] == [(3, 1), (3, 1)]  # steady state: the segments, and the forward's read
    torch.testing.assert_close(losses["tpu"], losses["cpu"], rtol=1e-4, atol=0)


class _Tokens(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(2, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def _trainer_run(device: str, out) -> tuple[list, list]:
    """transformers' Trainer: 3 steps of 2 accumulated micro-batches, a checkpoint after 2, an evaluation."""
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=3,
        logging_steps=1,
        save_steps=2,
        eval_strategy="steps",
        eval_steps=3,
        use_cpu=device == "cpu",
        report_to=[],
        disable_tqdm=True,
        seed=0,
    )
    trainer = Trainer(model=llama(), args=args, train_dataset=_Tokens(), eval_dataset=_Tokens())
    trainer.train()
    assert next(trainer.model.parameters()).device.type == device
    logged = [(h["loss"], h["grad_norm"]) for h in trainer.state.log_history if "loss" in h]
    saved = LlamaForCausalLM.from_pretrained(out / "checkpoint-2").state_dict()
    return logged + [trainer.state.log_history[-2]["eval_loss"]], list(saved.values())


def test_trainer_picks_the_device_and_matches_cpu(tmp_path):
    """``Trainer`` trains on tpu with no argument naming it (accelerate asks ``torch.accelerator``), with
    CPU's losses, gradient norms (clipped), checkpoint and evaluation."""
    on_cpu, cpu_saved = _trainer_run("cpu", tmp_path / "cpu")
    on_tpu, tpu_saved = _trainer_run("tpu", tmp_path / "tpu")
    torch.testing.assert_close(on_tpu, on_cpu, rtol=1e-4, atol=0)
    for got, expected in zip(tpu_saved, cpu_saved, strict=True):
        torch.testing.assert_close(got, expected, **tolerance(torch.float32))
