"""``model.generate(..., custom_generate=lazytpu.generation.decode)``: CPU's tokens from a fixed set of programs.

Small transformers causal LMs with random weights (nothing is downloaded);
CPU torch's own ``generate`` of the same model is the reference. The counts
of programs compiled are the point of the loop (Note [Static generation] in
``lazytpu.generation``).
"""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers.utils import logging as hf_logging

import lazytpu
from lazytpu import generation

hf_logging.set_verbosity_error()
pytestmark = pytest.mark.usefixtures("fresh_dynamo")

VOCAB = 96
PAD, EOS = 1, 1
CACHE = 64
GREEDY = dict(do_sample=False, pad_token_id=PAD)


def _config(family: str):
    sizes = dict(vocab_size=VOCAB, num_hidden_layers=2, bos_token_id=0, eos_token_id=EOS)
    llama_like = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
    if family == "gpt2":
        return transformers.GPT2Config(n_embd=64, n_head=4, n_positions=CACHE, **{**sizes, "n_layer": 2})
    if family == "llama":
        return transformers.LlamaConfig(max_position_embeddings=CACHE, **llama_like, **sizes)
    if family == "qwen2":
        return transformers.Qwen2Config(max_position_embeddings=CACHE, use_sliding_window=False, **llama_like, **sizes)
    return transformers.MistralConfig(max_position_embeddings=CACHE, sliding_window=None, **llama_like, **sizes)


def _models(family: str):
    """The same random model on CPU and on tpu."""
    torch.manual_seed(0)
    cpu = transformers.AutoModelForCausalLM.from_config(_config(family)).eval()
    torch.manual_seed(0)
    tpu = transformers.AutoModelForCausalLM.from_config(_config(family)).eval().to("tpu")
    return cpu, tpu


def _prompt(batch: int, length: int) -> dict[str, torch.Tensor]:
    """Random prompts; with a batch, the first is left-padded by two masked pad tokens."""
    ids = torch.randint(2, VOCAB, (batch, length), generator=torch.Generator().manual_seed(length))
    mask = torch.ones_like(ids)
    if batch > 1:
        ids[0, :2], mask[0, :2] = PAD, 0
    return {"input_ids": ids, "attention_mask": mask}


def _decode(model, prompt: dict, device: str = "cpu", **options) -> tuple[torch.Tensor, dict]:
    """Tokens of a generation by ``decode`` (on CPU) and its metrics."""
    lazytpu.metrics.reset()
    inputs = {k: v.to(device) for k, v in prompt.items()}
    out = model.generate(**inputs, custom_generate=generation.decode, cache_len=CACHE, **options)
    assert out.device.type == device  # returned where the prompt was, as transformers does
    return out.cpu(), lazytpu.metrics.snapshot()


@pytest.mark.parametrize("family", ["llama", "gpt2", "qwen2", "mistral"])
def test_greedy_tokens_equal_cpu_and_compile_nothing_per_token(family):
    cpu, tpu = _models(family)
    cases = [(2, 8, 20), (2, 11, 12), (1, 5, 30)]  # batch, prompt length, new tokens
    expected = [cpu.generate(**_prompt(b, n), max_new_tokens=m, **GREEDY) for b, n, m in cases]
    for (batch, length, new), want in zip(cases, expected):
        tokens, first = _decode(tpu, _prompt(batch, length), max_new_tokens=new, **GREEDY)
        assert torch.equal(tokens, want), (batch, length, new)
        assert first["cpu_fallbacks"] == {}
    # Warm: another prompt length of the bucket, another max_new_tokens, the prompt on tpu or on CPU.
    tokens, warm = _decode(tpu, _prompt(2, 9), max_new_tokens=25, **GREEDY)
    assert torch.equal(tokens, cpu.generate(**_prompt(2, 9), max_new_tokens=25, **GREEDY))
    assert warm["programs_compiled"] == 0
    # one program per token, and two or three for the generation (uploads, prefill, result)
    assert 25 <= warm["programs_executed"] <= 25 + 3


def test_a_prompt_on_tpu_compiles_only_transformers_input_checks_per_length():
    """Transformers' preparation of a prompt on tpu is a few small programs per
    prompt length; the loop itself compiles nothing (Note [Prompts on the host])."""
    cpu, tpu = _models("llama")
    _decode(tpu, _prompt(2, 8), "tpu", max_new_tokens=10, **GREEDY)
    tokens, stats = _decode(tpu, _prompt(2, 11), "tpu", max_new_tokens=10, **GREEDY)
    assert torch.equal(tokens, cpu.generate(**_prompt(2, 11), max_new_tokens=10, **GREEDY))
    assert 0 < stats["programs_compiled"] <= 4
    _, again = _decode(tpu, _prompt(2, 11), "tpu", max_new_tokens=10, **GREEDY)
    assert again["programs_compiled"] == 0


def test_default_buckets_grow_logarithmically():
    assert [generation.prompt_bucket(n) for n in (1, 5, 16, 17, 33, 100)] == [16, 16, 16, 32, 64, 128]
    assert generation.cache_length(16, 20) == 64 and generation.cache_length(16, 48) == 64
    assert generation.cache_length(32, 100) == 256
    _, tpu = _models("llama")
    # without cache_len: a power-of-two cache, so max_new_tokens of 20..48 share one set of programs
    tpu.generate(**_prompt(1, 6), custom_generate=generation.decode, max_new_tokens=20, **GREEDY)
    lazytpu.metrics.reset()
    tpu.generate(**_prompt(1, 6), custom_generate=generation.decode, max_new_tokens=48, **GREEDY)
    assert lazytpu.metrics.snapshot()["programs_compiled"] == 0


def _eos_run(cpu):
    """An end-of-sequence token that the first prompt reaches after 4 tokens, and CPU's tokens with it."""
    prompt = _prompt(2, 8)
    free = cpu.generate(**prompt, max_new_tokens=30, **GREEDY)
    eos = int(free[0, 8 + 3])
    return prompt, eos, cpu.generate(**prompt, max_new_tokens=30, eos_token_id=eos, **GREEDY)


def test_end_of_sequence_stops_like_cpu_with_one_host_read_per_check():
    """The stopping state is read every ``check_every`` tokens, a byte each (Note [Deferred stopping])."""
    cpu, tpu = _models("llama")
    prompt, eos, expected = _eos_run(cpu)  # the first sequence stops after 4 tokens, the second runs on
    read = {}
    for check_every in (1, 8):
        tokens, stats = _decode(tpu, prompt, max_new_tokens=30, eos_token_id=eos, check_every=check_every, **GREEDY)
        assert torch.equal(tokens, expected)
        assert (tokens[0, 8 + 4 :] == PAD).all()  # a finished sequence gets pad tokens
        read[check_every] = stats["bytes_from_device"]
    assert read[1] - read[8] == 29 - 3  # checks after tokens 1..29, against 8, 16, 24
    # one sequence that stops: the host sees it at the next check, and the loop ends there
    single = {k: v[:1] for k, v in prompt.items()}
    want = cpu.generate(**single, max_new_tokens=30, eos_token_id=eos, **GREEDY)
    assert want.shape[1] == 8 + 4
    for check_every, steps in ((1, 4), (8, 8)):
        tokens, stats = _decode(tpu, single, max_new_tokens=30, eos_token_id=eos, check_every=check_every, **GREEDY)
        assert torch.equal(tokens, want)
        assert steps <= stats["programs_executed"] <= steps + 3


def test_sampling_is_reproducible_with_a_seed_and_compiles_nothing_when_warm():
    _, tpu = _models("llama")
    options = dict(do_sample=True, top_k=20, temperature=0.8, max_new_tokens=16, pad_token_id=PAD)
    runs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        runs.append(_decode(tpu, _prompt(2, 8), **options))
    (a, _), (b, warm), (c, _) = runs
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert warm["programs_compiled"] == 0 and warm["cpu_fallbacks"] == {}
    assert a.shape == (2, 24) and ((a >= 0) & (a < VOCAB)).all()


def test_scores_in_a_dict_output_equal_cpu():
    cpu, tpu = _models("gpt2")
    options = dict(max_new_tokens=6, return_dict_in_generate=True, output_scores=True, **GREEDY)
    want = cpu.generate(**_prompt(2, 8), **options)
    got = tpu.generate(**_prompt(2, 8), custom_generate=generation.decode, cache_len=CACHE, **options)
    assert torch.equal(got.sequences.cpu(), want.sequences)
    assert len(got.scores) == len(want.scores) == 6
    for mine, theirs in zip(got.scores, want.scores):
        torch.testing.assert_close(mine.cpu(), theirs, atol=1e-4, rtol=1e-4)


def test_what_decode_does_not_cover_runs_transformers_loop_with_a_warning():
    cpu, tpu = _models("gpt2")
    prompt = _prompt(1, 8)
    want = cpu.generate(**prompt, max_new_tokens=5, num_beams=2, **GREEDY)
    with pytest.warns(UserWarning, match="beam search"):
        got = tpu.generate(
            **{k: v.to("tpu") for k, v in prompt.items()},
            custom_generate=generation.decode,
            max_new_tokens=5,
            num_beams=2,
            **GREEDY,
        )
    assert torch.equal(got.cpu(), want)


def _t5():
    config = transformers.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=EOS, dropout_rate=0.0,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(config).eval()


def test_encoder_decoder_greedy_tokens_equal_cpu_and_compile_nothing_per_token():
    """T5 runs the loop on its decoder, the encoder's states padded to the bucket
    (Note [Encoder-decoder generation])."""
    model = _t5()
    cases = [(2, 8, 8), (2, 11, 20), (1, 5, 12)]  # batch, prompt length, new tokens
    expected = [model.generate(**_prompt(b, n), max_new_tokens=m, do_sample=False) for b, n, m in cases]
    model.to("tpu")
    for (batch, length, new), want in zip(cases, expected):
        tokens, _ = _decode(model, _prompt(batch, length), "tpu", max_new_tokens=new, do_sample=False)
        assert torch.equal(tokens, want), (batch, length, new)
    # Warm: the same prompt length with another max_new_tokens compiles nothing; another length of
    # the bucket compiles only what transformers runs before the loop (the encoder, its input checks).
    want = model.cpu().generate(**_prompt(2, 11), max_new_tokens=30, do_sample=False)
    model.to("tpu")
    tokens, warm = _decode(model, _prompt(2, 11), "tpu", max_new_tokens=30, do_sample=False)
    assert torch.equal(tokens, want)
    assert warm["programs_compiled"] == 0 and warm["cpu_fallbacks"] == {}
    _, other_length = _decode(model, _prompt(2, 9), "tpu", max_new_tokens=30, do_sample=False)
    assert 0 < other_length["programs_compiled"] <= 3
    # transformers' own loop on tpu: the same tokens, a program per token
    on_tpu = {k: v.to("tpu") for k, v in _prompt(2, 11).items()}
    assert torch.equal(model.generate(**on_tpu, max_new_tokens=3, do_sample=False).cpu(), want[:, :4])


def test_a_cache_too_short_is_an_error_before_any_work():
    _, tpu = _models("llama")
    with pytest.raises(ValueError, match="cache_len=32 cannot hold the padded prompt"):
        tpu.generate(**_prompt(1, 8), custom_generate=generation.decode, cache_len=32, max_new_tokens=20, **GREEDY)
    with pytest.raises(ValueError, match="check_every must be at least 1"):
        tpu.generate(**_prompt(1, 8), custom_generate=generation.decode, check_every=0, max_new_tokens=4, **GREEDY)
