"""Text generation with a fixed set of programs: ``model.generate(..., custom_generate=lazytpu.generation.decode)``.

Note [Static generation]: transformers' own decoding loop grows its tensors
by one token per step (``torch.cat`` onto ``input_ids`` and the attention
mask, slices at the new length). On ``tpu`` every shape and slice offset is
part of a program, so that loop compiles a program for nearly every token.
``decode`` is a decoding loop with the same results whose every device shape
depends only on the batch size, the prompt's length bucket and the cache
length:

- the prompt is left-padded (on the host) with masked pad tokens to its
  length bucket (``prompt_bucket``, default the next power of two, at least
  16): masked positions take no part in attention, and position ids count
  only the real tokens, as transformers computes them;
- the tokens and the attention mask live in buffers of the cache's length,
  written at a position held as a device tensor (``index_copy_``,
  ``index_fill_``), never at a Python offset; the KV cache is a
  ``StaticCache`` of that length (default the next power of two that holds
  the prompt bucket and ``max_new_tokens``; pass ``cache_len`` to pin it,
  and every ``max_new_tokens`` up to it reuses the same programs);
- the model's decode step is compiled once with
  ``torch.compile(backend="tpu")``: a step is one graph call, not hundreds of
  recorded ops;
- each step ends in an asynchronous flush: one program per step, the same
  program at every step, so the host records step k+1 while the device runs
  step k.

So a generation compiles the prefill once per (batch size, prompt bucket,
cache length) and the decode step once per (batch size, cache length).

Stopping needs no host read per token (Note [Deferred stopping]). Logits
processors and stopping criteria receive the tokens so far as a view of the
buffer with the shape transformers would give them; the ones that only read
its shape (min length, temperature, top-k, top-p) keep every program the
same, one that reads its values (a repetition penalty, stop strings) still
works but records a read of a growing window, so it compiles per length.

Note [Deferred stopping]: transformers reads ``unfinished_sequences.max()
== 0`` after every token, a host read that waits for the device and cuts the
next step's program. ``decode`` keeps the stopping state on the device: a
sequence that produced an end-of-sequence token is marked finished and gets
pad tokens from then on (as in transformers), and the count of steps each
sequence was still running is summed on the device. The host reads whether
any sequence is still running only every ``check_every`` tokens; the steps
run past the last stop produce only pad tokens, and the result is cut at the
step where the last sequence stopped, so it equals transformers' (the cost
is at most ``check_every - 1`` wasted steps). The length limit is a host
counter, and ``max_time`` a host clock. A streamer needs every token on the
host, so with one the check runs at every token.

An encoder-decoder model (T5) runs the same loop on its decoder (Note
[Encoder-decoder generation]).

What ``decode`` does not cover runs transformers' own loop with a warning:
beam search, assisted decoding, a cache passed in by the caller, attentions
or hidden states in the output, ``synced_gpus``, ``inputs_embeds`` and other
per-token model inputs.

Note [Encoder-decoder generation]: transformers runs the encoder before the
decoding loop, on the prompt at its own length (one program per prompt
length, once per call). ``decode`` pads the encoder's states, and its
attention mask with zeros, to the prompt's length bucket: padded positions
are masked out of the cross-attention, so the decoder computes what it
computes on the unpadded states. The decoder's prompt (the start token) is
not padded; its tokens and mask are the buffers above, its cache an
``EncoderDecoderCache`` of two ``StaticCache``: the self-attention's of the
cache length, the cross-attention's of the prompt bucket (filled at the
first step). So the decoder's programs depend only on the batch size, the
prompt bucket and the cache length, as a decoder-only model's do.
"""

from __future__ import annotations

import copy
import functools
import time
import warnings

import torch

__all__ = ["decode", "prompt_bucket", "cache_length"]

_MIN_BUCKET = 16
_HANDLED_KWARGS = {"attention_mask", "position_ids", "cache", "use_cache", "logits_to_keep", "encoder_outputs"}


def prompt_bucket(length: int) -> int:
    """The padded length of a prompt of ``length`` tokens: the next power of two, at least 16."""
    return max(_MIN_BUCKET, 1 << max(length - 1, 0).bit_length())


def cache_length(bucket: int, new_tokens: int) -> int:
    """The default cache length: the next power of two that holds ``bucket + new_tokens`` tokens."""
    return prompt_bucket(bucket + new_tokens)


def decode(
    model,
    input_ids: torch.Tensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    cache_len: int | None = None,
    prompt_len: int | None = None,
    check_every: int = 8,
    compile_step: bool = True,
    **model_kwargs,
):
    """The decoding loop of Note [Static generation], for ``model.generate``'s ``custom_generate``.

    Args beyond transformers' (pass them to ``generate``):
        cache_len: the KV cache's length (default: ``cache_length`` of the
            prompt bucket and the new tokens). Prompt bucket plus
            ``max_new_tokens`` must fit in it.
        prompt_len: the prompt's padded length (default ``prompt_bucket``).
        check_every: read whether every sequence has stopped once every this
            many tokens (Note [Deferred stopping]); 1 reads it every token.
        compile_step: compile the model's decode step (default); ``False``
            records it op by op.

    Returns:
        What ``generate`` returns: the prompt and the new tokens, or a
        ``GenerateDecoderOnlyOutput`` with ``return_dict_in_generate``.
    """
    why = _unsupported(model, generation_config, synced_gpus, model_kwargs)
    if why:
        return _transformers_loop(
            why,
            model,
            input_ids,
            logits_processor,
            stopping_criteria,
            generation_config,
            synced_gpus,
            streamer,
            **model_kwargs,
        )
    if check_every < 1:
        raise ValueError(f"check_every must be at least 1, got {check_every}")
    loop = _Loop(model, input_ids, generation_config, model_kwargs, cache_len, prompt_len)
    processors = [_on_device(p, loop.device) for p in logits_processor]
    criteria = [_on_device(c, loop.device) for c in stopping_criteria]
    return loop.run(processors, criteria, streamer, check_every, compile_step)


def _on_device(obj, device: torch.device):
    """``obj`` (a logits processor or stopping criterion), or a shallow copy whose tensors are on ``device``.

    Note [Prompts on the host]: transformers builds the processors and criteria
    on the prompt's device. A prompt given on CPU (as a tokenizer returns it)
    keeps transformers' input preparation on CPU, where a new prompt length
    compiles nothing; the loop then runs on the model's device, with copies of
    the processors that hold their tensors there.
    """
    moved = {
        name: value.to(device)
        for name, value in vars(obj).items()
        if isinstance(value, torch.Tensor) and value.device != device
    }
    if not moved:
        return obj
    clone = copy.copy(obj)
    vars(clone).update(moved)
    return clone


def _unsupported(model, generation_config, synced_gpus: bool, model_kwargs: dict) -> str | None:
    """Why ``decode`` cannot run this generation, or None."""
    if model.config.is_encoder_decoder and model_kwargs.get("encoder_outputs") is None:
        return "an encoder-decoder model without encoder outputs"
    if generation_config.num_beams > 1 or generation_config.is_assistant:
        return "beam search and assisted decoding"
    if synced_gpus:
        return "synced_gpus"
    if generation_config.prefill_chunk_size is not None:
        return "chunked prefill"
    if generation_config.return_dict_in_generate and (
        generation_config.output_attentions or generation_config.output_hidden_states
    ):
        return "attentions and hidden states in the output"
    if getattr(model_kwargs.get("cache"), "_is_user_defined", False):
        return "a cache passed in by the caller"
    extra = sorted(k for k, v in model_kwargs.items() if k not in _HANDLED_KWARGS and v is not None)
    if extra:
        return f"the model inputs {extra}"
    return None


def _transformers_loop(
    why, model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus, streamer, **model_kwargs
):
    from transformers.generation.utils import GENERATION_MODES_MAPPING

    warnings.warn(
        f"lazytpu.generation.decode does not support {why}; running transformers' own decoding loop, "
        "which compiles a program for nearly every token on tpu",
        stacklevel=3,
    )
    method = getattr(type(model), GENERATION_MODES_MAPPING[generation_config.get_generation_mode()])
    return method(
        model,
        input_ids,
        logits_processor=logits_processor,
        stopping_criteria=stopping_criteria,
        generation_config=generation_config,
        synced_gpus=synced_gpus,
        streamer=streamer,
        **model_kwargs,
    )


def _select(scores, unfinished, counted, position, tokens, eos_ids, pad: int, sample: bool):
    """Each sequence's next token, written into ``tokens`` at ``position``; and whether any still runs.

    Note [Deferred stopping] says how the stopping state is kept.
    """
    if sample:
        chosen = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
    else:
        chosen = torch.argmax(scores, dim=-1)
    counted = counted + unfinished
    if eos_ids is not None:
        chosen = torch.where(unfinished, chosen, pad)
        unfinished = unfinished & ~(chosen[:, None] == eos_ids).any(dim=-1)
    tokens.index_copy_(1, position, chosen[:, None])
    return chosen, unfinished, counted, unfinished.any()


def _forward(model, ids, mask, positions, cache, encoder, **extra):
    """The model on ``ids``: a decoder-only model, or with ``encoder`` (states, mask) an encoder-decoder's decoder."""
    if encoder is None:
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, **extra)
    states, encoder_mask = encoder
    return model(
        decoder_input_ids=ids,
        decoder_attention_mask=mask,
        encoder_outputs=states,
        attention_mask=encoder_mask,
        cache=cache,
        use_cache=True,
    )


def _advance(model, chosen, mask, position, positions, cache, encoder):
    """The model on the chosen tokens: the next step's float32 logits, position and position ids."""
    mask.index_fill_(1, position, 1)
    positions = positions + 1
    out = _forward(model, chosen[:, None], mask, positions, cache, encoder)
    return out.logits[:, -1].to(dtype=torch.float32, copy=True), position + 1, positions


def _step(model, scores, unfinished, counted, position, positions, tokens, mask, cache, encoder, eos_ids, pad: int):
    """A greedy step with nothing of the caller's between the model's logits and the choice."""
    chosen, unfinished, counted, running = _select(scores, unfinished, counted, position, tokens, eos_ids, pad, False)
    logits, position, positions = _advance(model, chosen, mask, position, positions, cache, encoder)
    return chosen, unfinished, counted, running, logits, position, positions


@functools.cache
def _compiled(fn):
    """``fn`` under ``torch.compile(backend="tpu")``, made on first use (one per process)."""
    return torch.compile(fn, backend="tpu", dynamic=False)


class _Loop:
    """One generation's buffers (Note [Static generation]), built on the host and uploaded."""

    def __init__(self, model, input_ids, generation_config, model_kwargs, cache_len, prompt_len):
        from transformers import EncoderDecoderCache, StaticCache

        self.model = model
        self.config = generation_config
        self.device = model.device
        self.prompt = input_ids
        batch, length = input_ids.shape
        self.length = length
        seq2seq = model.config.is_encoder_decoder
        self.encoder = _padded_encoder(model_kwargs, prompt_len, self.device) if seq2seq else None
        self.bucket = length if seq2seq else (prompt_len or prompt_bucket(length))
        if self.bucket < length:
            raise ValueError(f"prompt_len={self.bucket} is shorter than the prompt ({length} tokens)")
        self.max_new = generation_config.max_length - length
        self.cache_len = cache_len or cache_length(self.bucket, self.max_new)
        if self.bucket + self.max_new > self.cache_len:
            raise ValueError(
                f"cache_len={self.cache_len} cannot hold the padded prompt ({self.bucket} tokens) "
                f"and max_new_tokens={self.max_new}"
            )
        self.pad = _pad_id(generation_config)
        left = self.bucket - length
        self.left = left
        host_ids = input_ids.cpu()
        mask = None if seq2seq else model_kwargs.get("attention_mask")  # an encoder-decoder's is the encoder's
        host_mask = torch.ones_like(host_ids) if mask is None else mask.cpu().to(torch.long)
        positions = model_kwargs.get("position_ids")
        if positions is None:
            host_pos = (host_mask.cumsum(-1) - 1).masked_fill(host_mask == 0, 0)
        else:
            host_pos = positions.cpu().expand(batch, length)
        tokens = torch.full((batch, self.cache_len), self.pad, dtype=torch.long)
        tokens[:, left : self.bucket] = host_ids
        att = torch.zeros((batch, self.cache_len), dtype=torch.long)
        att[:, left : self.bucket] = host_mask
        pos = torch.zeros((batch, self.bucket), dtype=torch.long)
        pos[:, left:] = host_pos
        self.tokens = tokens.to(self.device)
        self.mask = att.to(self.device)
        self.positions = pos.to(self.device)
        decoder_config = model.config.get_text_config(decoder=True)
        self.cache = StaticCache(config=decoder_config, max_cache_len=self.cache_len)
        if seq2seq:  # Note [Encoder-decoder generation]
            cross = StaticCache(config=decoder_config, max_cache_len=self.encoder[1].shape[1])
            self.cache = EncoderDecoderCache(self.cache, cross)

    def window(self, generated: int) -> torch.Tensor:
        """The tokens so far, shaped as transformers' ``input_ids`` (a view: reading only its shape records nothing)."""
        return self.tokens[:, self.left : self.bucket + generated]

    def run(self, logits_processor, stopping_criteria, streamer, check_every: int, compile_step: bool):
        from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria

        from lazytpu.engine import sync_all

        def sync() -> None:
            sync_all("lazytpu.sync")  # what lazytpu.sync() does (docs/sync_points.md)

        eos = [c.eos_token_id for c in stopping_criteria if isinstance(c, EosTokenCriteria)]
        eos_ids = torch.cat([e.to(self.device).view(-1) for e in eos]) if eos else None
        timers = [c for c in stopping_criteria if isinstance(c, MaxTimeCriteria)]
        others = [
            c for c in stopping_criteria if not isinstance(c, (EosTokenCriteria, MaxLengthCriteria, MaxTimeCriteria))
        ]
        lengths = [c.max_length for c in stopping_criteria if isinstance(c, MaxLengthCriteria)]
        steps = min([self.max_new] + [n - self.length for n in lengths])
        stop_on_device = eos_ids is not None or bool(others)
        keep = self.config.return_dict_in_generate
        scores, raw = [], []
        sample = bool(self.config.do_sample)
        fused = compile_step and not (logits_processor or others or sample or keep)
        step = _compiled(_step) if fused else None
        advance = _compiled(_advance) if compile_step else _advance

        batch = self.tokens.shape[0]
        unfinished = torch.ones(batch, dtype=torch.bool, device=self.device)
        counted = torch.zeros(batch, dtype=torch.long, device=self.device)
        position = torch.full((1,), self.bucket, dtype=torch.long, device=self.device)
        out = _forward(
            self.model,
            self.tokens[:, : self.bucket],
            self.mask,
            self.positions,
            self.cache,
            self.encoder,
            **({} if self.encoder else {"logits_to_keep": 1}),
        )
        logits = out.logits[:, -1].to(dtype=torch.float32, copy=True)
        del out
        positions = self.positions[:, -1:].clone()  # materialized by the prefill, as every later step's
        sync()
        for done in range(1, steps + 1):
            if fused and done < steps:
                chosen, unfinished, counted, running, logits, position, positions = step(
                    self.model, logits, unfinished, counted, position, positions,
                    self.tokens, self.mask, self.cache, self.encoder, eos_ids, self.pad,
                )  # fmt: skip
            else:
                step_scores = logits
                for processor in logits_processor:
                    step_scores = processor(self.window(done - 1), step_scores)
                if keep and self.config.output_scores:
                    scores.append(step_scores)
                if keep and self.config.output_logits:
                    raw.append(logits)
                chosen, unfinished, counted, running = _select(
                    step_scores, unfinished, counted, position, self.tokens, eos_ids, self.pad, sample
                )
                for criteria in others:
                    unfinished = unfinished & ~criteria(self.window(done), step_scores)
                if others:
                    running = unfinished.any()
            if streamer is not None:
                streamer.put(chosen.cpu())
            if done == steps or any(t.max_time < time.time() - t.initial_timestamp for t in timers):
                break
            if not fused:
                logits, position, positions = advance(
                    self.model, chosen, self.mask, position, positions, self.cache, self.encoder
                )
            sync()  # Note [Static generation]: one program per step
            if stop_on_device and (done % check_every == 0 or streamer is not None) and not bool(running):
                break
        if streamer is not None:
            streamer.end()
        return self._result(counted, scores, raw, stop_on_device)

    def _result(self, counted, scores, raw, stop_on_device: bool):
        """The prompt and the tokens generated until every sequence stopped, as ``generate`` returns them."""
        generated = int(counted.max()) if stop_on_device else int(counted[0])
        tokens = self.tokens.cpu()[:, self.bucket : self.bucket + generated]
        sequences = torch.cat([self.prompt.cpu(), tokens], dim=1).to(self.prompt.device)
        if not self.config.return_dict_in_generate:
            return sequences
        from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerateEncoderDecoderOutput

        output = GenerateEncoderDecoderOutput if self.encoder else GenerateDecoderOnlyOutput
        return output(
            sequences=sequences,
            scores=tuple(scores[:generated]) if self.config.output_scores else None,
            logits=tuple(raw[:generated]) if self.config.output_logits else None,
            past_key_values=self.cache if self.config.use_cache else None,
        )


def _padded_encoder(model_kwargs: dict, prompt_len: int | None, device: torch.device) -> tuple:
    """The encoder's outputs and attention mask, padded to the prompt's bucket (Note [Encoder-decoder generation])."""
    outputs = model_kwargs["encoder_outputs"]
    states = outputs.last_hidden_state
    batch, length = states.shape[:2]
    bucket = prompt_len or prompt_bucket(length)
    if bucket < length:
        raise ValueError(f"prompt_len={bucket} is shorter than the prompt ({length} tokens)")
    mask = model_kwargs.get("attention_mask")
    host_mask = torch.zeros((batch, bucket), dtype=torch.long)
    host_mask[:, :length] = 1 if mask is None else mask.cpu().to(torch.long)
    padded = copy.copy(outputs)
    padded["last_hidden_state"] = torch.nn.functional.pad(states.to(device), (0, 0, 0, bucket - length))
    return padded, host_mask.to(device)


def _pad_id(generation_config) -> int:
    """The token that fills the padding and the finished sequences, as transformers picks it."""
    pad = generation_config._pad_token_tensor
    if pad is None:
        return 0
    return int(pad.view(-1)[0])
