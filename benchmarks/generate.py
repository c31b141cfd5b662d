"""Generation: tokens/s, time to first token and programs compiled per call (issue 22).

    python -m benchmarks --workloads generate      # or: python -m benchmarks.generate [options]

Small transformers Llama and GPT-2 models (random weights: vocab 256, width
128, 2 layers, 4 heads), a 12-token prompt given on CPU as a tokenizer
returns it, greedy, ``--new-tokens`` (default 128) new tokens at each batch
size of ``--batches`` (default 1 and 8). Variants, interleaved round by
round in this one process with the threads of Note [Equal threads] in
benchmarks.settings:

- ``cpu``: CPU torch's ``model.generate``;
- ``defer`` and ``strict``: ``model.generate(custom_generate=lazytpu.generation.decode)``
  on ``tpu`` in each eager mode (Note [Static generation] in lazytpu.generation);
- ``defer_check1``: ``defer`` reading the stopping state after every token
  instead of every 8 (Note [Deferred stopping]); every variant gets an
  end-of-sequence token that the model never produces, so the check runs and
  never stops early;
- ``hf`` (not in the default list): plain ``model.generate`` on ``tpu``,
  transformers' own loop, which compiles a program per token on its first
  call.

Every variant's tokens are checked equal to CPU torch's. Reported per
variant: warm tokens/s (the median of ``--rounds`` calls after one warm-up
call), the first call's seconds (its compiles included; the process's
caches are fresh, not the disk's), and programs compiled per warm call.

Time to first token runs in child processes, one generation of one token
(the prefill and the first choice), with a fresh lazytpu disk cache (cold)
and then again with the cache the first child left (warm), each child a new
process with nothing compiled in memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

VARIANTS = ("cpu", "defer", "strict", "defer_check1", "hf")
DEFAULT_VARIANTS = ("cpu", "defer", "strict", "defer_check1")
SIZES = dict(vocab=256, width=128, layers=2, heads=4, ff=256)
PROMPT = 12
SEED = 0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.generate", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama,gpt2")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5, help="warm calls timed per variant")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="comma list of " + ", ".join(VARIANTS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-ttft", action="store_true", help="skip the time-to-first-token child processes")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--ttft-child", help=argparse.SUPPRESS)  # MODEL: one timed first token, JSON on stdout
    args = p.parse_args(argv)
    args.models = args.models.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.variants = [v for v in args.variants.split(",") if v]
    for v in args.variants:
        if v not in VARIANTS:
            p.error(f"unknown variant {v!r}: expected one of {', '.join(VARIANTS)}")
    return args


def _model(family: str):
    import torch
    import transformers

    v, w, n, h, ff = (SIZES[k] for k in ("vocab", "width", "layers", "heads", "ff"))
    if family == "llama":
        config = transformers.LlamaConfig(
            vocab_size=v, hidden_size=w, intermediate_size=ff, num_hidden_layers=n, num_attention_heads=h,
            num_key_value_heads=h // 2, max_position_embeddings=512,
        )  # fmt: skip
    else:
        config = transformers.GPT2Config(
            vocab_size=v, n_embd=w, n_inner=ff, n_layer=n, n_head=h, n_positions=512,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
    torch.manual_seed(SEED)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def _prompt(batch: int):
    import torch

    return torch.randint(2, SIZES["vocab"], (batch, PROMPT), generator=torch.Generator().manual_seed(SEED + batch))


class _Case:
    """One variant of one (model, batch): a callable generation and its counters."""

    def __init__(self, variant: str, cpu_model, tpu_model, ids, options: dict) -> None:
        import lazytpu.generation

        self.variant = variant
        self.model = cpu_model if variant == "cpu" else tpu_model
        self.ids = ids
        self.options = dict(options)
        if variant in ("defer", "strict", "defer_check1"):
            self.options.update(custom_generate=lazytpu.generation.decode)
        if variant == "defer_check1":
            self.options.update(check_every=1)
        self.times: list[float] = []
        self.compiled: list[int] = []
        self.first_s = 0.0

    def run(self):
        import torch

        import lazytpu

        ids = self.ids if self.variant != "hf" else self.ids.to("tpu")
        mode = "strict" if self.variant == "strict" else "defer"
        before = lazytpu.metrics.snapshot()["programs_compiled"]
        start = time.perf_counter()
        with torch.tpu.set_eager_mode(mode):
            out = self.model.generate(ids, **self.options).cpu()
        seconds = time.perf_counter() - start
        return out, seconds, lazytpu.metrics.snapshot()["programs_compiled"] - before


def _unused_token(tokens) -> int:
    """A token id that ``tokens`` never contains: an end-of-sequence that never stops a run."""
    seen = set(tokens.flatten().tolist())
    return next(t for t in range(2, SIZES["vocab"]) if t not in seen)


def measure(family: str, batch: int, args) -> dict:
    import torch

    cpu_model = _model(family)
    tpu_model = _model(family).to("tpu")
    ids = _prompt(batch)
    greedy = dict(max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
    free = cpu_model.generate(ids, **greedy)
    options = dict(greedy, eos_token_id=_unused_token(free))
    expected = cpu_model.generate(ids, **options)
    assert torch.equal(expected, free)
    cases = [_Case(v, cpu_model, tpu_model, ids, options) for v in args.variants]
    for case in cases:  # the first call: compiles included
        out, case.first_s, _ = case.run()
        if not torch.equal(out, expected):
            raise AssertionError(f"{family} batch {batch}: {case.variant}'s tokens differ from CPU torch's")
    for _ in range(args.rounds):  # interleaved, round by round
        for case in cases:
            _, seconds, compiled = case.run()
            case.times.append(seconds)
            case.compiled.append(compiled)
    tokens = batch * args.new_tokens
    rows = {}
    for case in cases:
        median = statistics.median(case.times)
        rows[case.variant] = dict(
            tokens_per_s=round(tokens / median, 1),
            median_s=round(median, 4),
            first_call_s=round(case.first_s, 2),
            compiled_per_warm_call=statistics.mean(case.compiled),
        )
    cpu = rows.get("cpu")
    if cpu:
        for row in rows.values():
            row["vs_cpu"] = round(row["tokens_per_s"] / cpu["tokens_per_s"], 2)
    return dict(model=family, batch=batch, new_tokens=args.new_tokens, variants=rows)


def _ttft_child(family: str) -> dict:
    """In a fresh process: seconds of a one-token generation (the prefill and its choice)."""
    import lazytpu
    import lazytpu.generation

    model = _model(family).to("tpu")
    ids = _prompt(1)
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=1, do_sample=False, pad_token_id=0, custom_generate=lazytpu.generation.decode)
    first = time.perf_counter() - start
    snap = lazytpu.metrics.snapshot()
    return dict(ttft_s=round(first, 3), compiled=snap["programs_compiled"], disk_hits=snap["disk_cache_hits"])


def time_to_first_token(family: str, threads: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="lazytpu-ttft-") as cache:
        env = dict(os.environ, LAZYTPU_CACHE_DIR=cache)
        runs = {}
        for label in ("cold", "warm"):
            cmd = [sys.executable, "-m", "benchmarks.generate", "--ttft-child", family, "--threads", str(threads)]
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[label] = json.loads(out.stdout.strip().splitlines()[-1])
    return runs


def table(results: list[dict], ttft: dict) -> str:
    lines = ["| model | batch | variant | tokens/s | vs cpu | first call s | compiled / warm call |", "|---" * 7 + "|"]
    for r in results:
        for variant, row in r["variants"].items():
            lines.append(
                f"| {r['model']} | {r['batch']} | {variant} | {row['tokens_per_s']} | {row.get('vs_cpu', '')} "
                f"| {row['first_call_s']} | {row['compiled_per_warm_call']} |"
            )
    if ttft:
        lines += ["", "| model | time to first token, cold disk cache | warm disk cache |", "|---|---|---|"]
        for family, runs in ttft.items():
            cold, warm = runs["cold"], runs["warm"]
            lines.append(
                f"| {family} | {cold['ttft_s']} s ({cold['compiled']} compiled) "
                f"| {warm['ttft_s']} s ({warm['compiled']} compiled, {warm['disk_hits']} from disk) |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    from benchmarks import settings

    args = parse_args(argv)
    env = settings.configure_environment(args.threads, warm_cache=args.ttft_child is not None)
    import torch
    from transformers.utils import logging as hf_logging

    import lazytpu  # noqa: F401 (the tpu device)

    hf_logging.set_verbosity_error()
    torch.set_num_threads(env["threads"])
    if args.ttft_child:
        print(json.dumps(_ttft_child(args.ttft_child)))
        return 0
    results = [measure(family, batch, args) for family in args.models for batch in args.batches]
    ttft = {} if args.no_ttft else {family: time_to_first_token(family, args.threads) for family in args.models}
    print(table(results, ttft))
    data = dict(
        argv=sys.argv[1:],
        loadavg=[round(x, 2) for x in os.getloadavg()],
        threads=env["threads"],
        results=results,
        time_to_first_token=ttft,
    )
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "generate.json")
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print(f"\nwrote {os.path.relpath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
