"""FSDP2 against DDP on the small Llama: step time and per-rank device memory (issue 24 item 6).

    python -m benchmarks.distributed [--world 2] [--steps 20] [--warmup 3] [--out FILE]

Launches ``--world`` ranks of this module on 127.0.0.1 (the ``tpu_dist``
backend over JAX's multi-process runtime, as ``torchrun`` would). Every rank
builds the suite's Llama (``benchmarks.workloads``' ``llama``: vocab 256,
width 128, 2 layers, 4 heads, 2 KV heads, MLP 256, sequence 32) twice from one
seed: once under ``DistributedDataParallel``, once under FSDP2
(``fully_shard`` per decoder layer and at the root), each with AdamW, each
rank its own batch of 4 sequences. Then, in one process per rank, the two
variants' steps are interleaved round by round (the order alternating, the
same on every rank: their collectives must match), each step timed with its
wait (``loss.item()`` and ``torch.tpu.synchronize()``).

Reported per variant: the median and p25-p75 step time over the ranks'
steady-state steps; the device memory a rank holds for its model
(``torch.tpu.memory_allocated()`` after the warm-up steps, less what it held
before building it: parameters and AdamW state, gradients freed by
``zero_grad``); the peak above that during a step
(``torch.tpu.max_memory_allocated()`` after ``reset_peak_memory_stats()``);
programs executed and compiled per steady-state step; and whether the two
variants' losses agree (they train the same model on the same data).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import subprocess
import sys
import time

VARIANTS = ("ddp", "fsdp2")
BATCH_PER_RANK = 4


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.distributed", description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=2, help="ranks (processes)")
    p.add_argument("--steps", type=int, default=20, help="steady-state steps timed per variant")
    p.add_argument("--warmup", type=int, default=3, help="steps run before timing")
    p.add_argument("--out", default=None, help="write the per-rank results as JSON here")
    p.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)  # a rank, launched by the parent
    return p.parse_args(argv)


# -- the rank side ----------------------------------------------------------------------------


def _build(variant: str, model, mesh):
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    from benchmarks.workloads import ADAMW

    model = copy.deepcopy(model).to("tpu")
    if variant == "ddp":
        wrapped = DDP(model)
    else:
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    return wrapped, torch.optim.AdamW(wrapped.parameters(), **ADAMW)


def _step(model, opt, ids):
    opt.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    opt.step()
    return loss.detach()


def rank_main(args) -> None:
    import torch
    import torch.distributed as dist
    import transformers
    from torch.distributed.device_mesh import init_device_mesh

    import lazytpu
    from benchmarks.workloads import HF_DEFAULTS, SEED, _hf_config

    dist.init_process_group(backend="tpu_dist")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("tpu", (world,))
    torch.manual_seed(SEED)
    base = transformers.AutoModelForCausalLM.from_config(_hf_config("llama", HF_DEFAULTS)).train()
    gen = torch.Generator().manual_seed(SEED + 4 + rank)
    ids = torch.randint(0, HF_DEFAULTS["vocab"], (BATCH_PER_RANK, HF_DEFAULTS["seq"]), generator=gen).to("tpu")

    models, memory, losses = {}, {}, {}
    for variant in VARIANTS:  # built and warmed one after the other: each one's memory is a difference
        torch.tpu.synchronize()
        before = torch.tpu.memory_allocated()
        models[variant] = _build(variant, base, mesh)
        losses[variant] = [_step(*models[variant], ids).item() for _ in range(args.warmup)]
        torch.tpu.synchronize()
        memory[variant] = torch.tpu.memory_allocated() - before

    times = {v: [] for v in VARIANTS}
    peaks, programs, compiles = {}, {v: [] for v in VARIANTS}, {v: 0 for v in VARIANTS}
    for r in range(args.steps):
        for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            torch.tpu.synchronize()
            resident = torch.tpu.memory_allocated()
            torch.tpu.reset_peak_memory_stats()
            before = lazytpu.metrics.snapshot()
            start = time.perf_counter()
            loss = _step(*models[variant], ids).item()
            torch.tpu.synchronize()
            times[variant].append(time.perf_counter() - start)
            after = lazytpu.metrics.snapshot()
            losses[variant].append(loss)
            peaks[variant] = max(peaks.get(variant, 0), torch.tpu.max_memory_allocated() - resident)
            programs[variant].append(after["programs_executed"] - before["programs_executed"])
            compiles[variant] += after["programs_compiled"] - before["programs_compiled"]
    result = dict(
        rank=rank,
        world=world,
        times=times,
        memory=memory,
        peak=peaks,
        programs=programs,
        compiles=compiles,
        losses=losses,
    )
    print("RESULT " + json.dumps(result), flush=True)
    dist.barrier()
    dist.destroy_process_group()


# -- the parent ---------------------------------------------------------------------------------


def _launch(args) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    argv = [sys.executable, "-m", "benchmarks.distributed", "--rank-run", "--steps", str(args.steps)]
    argv += ["--warmup", str(args.warmup)]
    procs = []
    for rank in range(args.world):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE=str(args.world),
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE=str(args.world),
            PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
            OMP_NUM_THREADS="1",
        )
        procs.append(subprocess.Popen(argv, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    results = []
    for rank, p in enumerate(procs):
        out, _ = p.communicate(timeout=1800)
        text = out.decode(errors="replace")
        lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"rank {rank} failed (exit {p.returncode}):\n{text[-4000:]}")
        results.append(json.loads(lines[-1].removeprefix("RESULT ")))
    return results


def report(results: list[dict]) -> str:
    """The table of ``results`` (one dict per rank)."""
    world = results[0]["world"]
    rows = [
        f"FSDP2 vs DDP, small Llama (2x128, seq 32), {world} ranks, batch {BATCH_PER_RANK} per rank, AdamW",
        f"{'variant':8} {'median ms':>10} {'p25-p75 ms':>14} {'held MiB/rank':>14} {'step peak MiB':>14} "
        f"{'progs/step':>10} {'recompiles':>10}",
    ]
    for v in VARIANTS:
        times = sorted(t * 1e3 for r in results for t in r["times"][v])
        q = statistics.quantiles(times, n=4)
        held = max(r["memory"][v] for r in results) / 2**20
        peak = max(r["peak"][v] for r in results) / 2**20
        progs = statistics.median(p for r in results for p in r["programs"][v])
        recompiles = sum(r["compiles"][v] for r in results)
        rows.append(
            f"{v:8} {statistics.median(times):10.2f} {q[0]:6.2f}-{q[2]:<7.2f} {held:14.3f} {peak:14.3f} "
            f"{progs:10g} {recompiles:10d}"
        )
    ratio = [
        statistics.median(a / b for a, b in zip(r["times"]["fsdp2"], r["times"]["ddp"], strict=True)) for r in results
    ]
    held_ratio = max(r["memory"]["fsdp2"] for r in results) / max(r["memory"]["ddp"] for r in results)
    same = all(
        abs(a - b) <= 1e-4 * max(1.0, abs(a))
        for r in results
        for a, b in zip(r["losses"]["ddp"], r["losses"]["fsdp2"], strict=True)
    )
    rows.append(f"fsdp2/ddp step time (median of per-round ratios, per rank): {', '.join(f'{x:.2f}' for x in ratio)}")
    rows.append(f"fsdp2/ddp memory held per rank: {held_ratio:.2f} (1/world = {1 / world:.2f})")
    rows.append(f"losses of the two variants equal on every rank and step: {same}")
    return "\n".join(rows)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.rank_run:
        rank_main(args)
        return
    results = _launch(args)
    print(report(results))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
