"""Compile time: lazytpu's first sync against ``jax.jit`` of the same computation (issue 21 item 4).

    python -m benchmarks.compile_time [--ops 250,500,1000] [--recurrence 96] [--llama] [--repeats 2]

**The chain** ``y = tanh(y @ W) * 0.5 + y * 0.5 + i * 1e-3`` (6 ops a round,
``ops // 6`` rounds) on an 8x64 input. Three timings per size, each from a
cold start of its own (a fresh ``jax.jit``; lazytpu's caches cleared, its
disk cache off), interleaved ``--repeats`` times; the fastest of each is
shown (the least disturbed by other work on the machine), as wall-clock and
as the process's CPU time:

- ``lazytpu``: recording the chain, then its first sync (compile and run);
  the ops' first calls in the process are made before (a 2-round chain),
  so this is the first sync of a chain, not the process's first op;
- ``all lifted``: the same with every number a runtime input, as lazytpu
  compiled before Note [Scalar specialization] in lazytpu.fusion.specialize;
- ``jax consts``: ``jax.jit`` of the chain in ``jax.numpy`` with its Python
  numbers as constants, as a JAX user writes it (XLA folds them in);
- ``jax params``: the same with the numbers as program parameters (one f64
  vector), the program ``all lifted`` compiles.

**The recurrence** (``--recurrence N``): torchaudio's ``lfilter`` loop (its
Python fallback, ``_lfilter_core_generic_loop``) over N samples of a
(2, 3, N) signal: per sample, a window of the output read, a batched product,
the sample written back through the input's view and into the output's
column (8 recorded ops, half of them windows at lifted offsets, Note [Box
windows] in lazytpu.lowering.strided), against ``jax.jit`` of the same loop
with ``x.at[...].set`` at static indices, as a JAX user writes it; also the
time of a second call, which compiles nothing (lazytpu's program cache,
``jax.jit``'s). 96 samples make one lazytpu program; 100 are cut in two by
the depth cap (Note [Graph depth] in lazytpu.ir.node).

**The llama step** (``--llama``; ``benchmarks.workloads``' transformers Llama
training step with AdamW): the first step's wall time (record, compile, run,
read the loss) and its programs' compile time, specialized and all lifted,
against ``jax.jit`` of the
same programs (each one's JAX function, ``lazytpu.lowering.lower_program``)
with their numbers as constants and as parameters; then the programs the
next steps compile (the second step's update is a program of its own, AdamW
making its state in the first; its bias corrections change at every step, so
the third compiles it once more with them lifted).
"""

from __future__ import annotations

import argparse
import contextlib
import time
import types
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import torch

import lazytpu
from lazytpu import _config, _dtypes, engine
from lazytpu.fusion import program as fusion_program
from lazytpu.fusion.specialize import Constant
from lazytpu.lowering import lower_program, program_args
from lazytpu.runtime import clear_caches

OPS_PER_ROUND = 6


def _torch_chain(y, w, rounds: int):
    for i in range(rounds):
        y = torch.tanh(y @ w) * 0.5 + y * 0.5 + i * 1e-3
    return y


def _jax_chain(y, w, numbers):
    for i in range(len(numbers) // 3):
        y = jnp.tanh(y @ w) * numbers[3 * i] + y * numbers[3 * i + 1] + numbers[3 * i + 2]
    return y


def _torch_recurrence(x, a, out):
    n_order = a.size(1)
    a = a.unsqueeze(2)
    for i, o0 in enumerate(x.permute(2, 0, 1)):
        window = out[:, :, i : i + n_order]
        o0 -= (window.transpose(0, 1) @ a)[..., 0].t()
        out[:, :, i + n_order - 1] = o0
    return out


def _jax_recurrence(x, a, out):
    n_order = a.shape[1]
    a = a[:, :, None]
    for i in range(x.shape[2]):
        window = out[:, :, i : i + n_order]
        o0 = x[:, :, i] - jnp.matmul(jnp.transpose(window, (1, 0, 2)), a)[..., 0].T
        x = x.at[:, :, i].set(o0)
        out = out.at[:, :, i + n_order - 1].set(o0)
    return out


@contextlib.contextmanager
def _lifted_only(on: bool) -> Iterator[None]:
    """With ``on``, every number is a runtime input, as before Note [Scalar specialization]."""
    if not on:
        yield
        return
    saved = fusion_program.specialize
    fusion_program.specialize = lambda structure, kinds, positions, values: (structure, kinds)
    try:
        yield
    finally:
        fusion_program.specialize = saved


class _Clock:
    """Wall-clock and process CPU time since it was made."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def since(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def _jax_once(fn, args) -> tuple[float, float]:
    clock = _Clock()
    jax.block_until_ready(jax.jit(fn).lower(*args).compile()(*args))
    return clock.since()


def _lazytpu_chain_once(x, w, rounds: int, lifted: bool = False) -> tuple[float, float]:
    tx, tw = x.to("tpu"), w.to("tpu")
    _torch_chain(tx, tw, 2).cpu()  # the ops' first calls in this process
    clear_caches()
    tx, tw = x.to("tpu"), w.to("tpu")
    lazytpu.sync()
    with _config.CACHE_DIR.override("off"), _lifted_only(lifted):  # a compile, not a load from the disk cache
        clock = _Clock()
        got = _torch_chain(tx, tw, rounds).cpu()
        spent = clock.since()
    torch.testing.assert_close(got, _torch_chain(x, w, rounds), rtol=1e-4, atol=1e-5)
    return spent


def measure_chain(ops: int, repeats: int) -> dict:
    """The fastest of ``repeats`` interleaved cold first syncs: {variant: (wall s, cpu s)}."""
    rounds = ops // OPS_PER_ROUND
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 64, generator=gen), torch.randn(64, 64, generator=gen) * 0.1
    numbers = [v for i in range(rounds) for v in (0.5, 0.5, i * 1e-3)]
    xj, wj = jnp.asarray(x.numpy()), jnp.asarray(w.numpy())
    runs: dict[str, list] = {"lazytpu": [], "lazytpu lifted": [], "jax consts": [], "jax params": []}
    for _ in range(repeats):
        runs["jax consts"].append(_jax_once(lambda a, b: _jax_chain(a, b, [jnp.float32(v) for v in numbers]), (xj, wj)))
        runs["jax params"].append(
            _jax_once(
                lambda a, b, v: _jax_chain(a, b, [v[j].astype(jnp.float32) for j in range(len(numbers))]),
                (xj, wj, np.asarray(numbers)),
            )
        )
        runs["lazytpu"].append(_lazytpu_chain_once(x, w, rounds))
        runs["lazytpu lifted"].append(_lazytpu_chain_once(x, w, rounds, lifted=True))
    return {"ops": rounds * OPS_PER_ROUND, **{k: (min(r[0] for r in v), min(r[1] for r in v)) for k, v in runs.items()}}


def measure_recurrence(samples: int, repeats: int) -> dict:
    """The fastest of ``repeats`` interleaved cold first calls and of the
    second calls: {variant: (first wall s, first cpu s, second wall s)}."""
    gen = torch.Generator().manual_seed(0)
    x, a = torch.randn(2, 3, samples, generator=gen), torch.randn(3, 4, generator=gen) * 0.1
    out = torch.zeros(2, 3, samples + 3)
    expected = _torch_recurrence(x.clone(), a, out.clone())
    runs: dict[str, list] = {"lazytpu": [], "jax": []}
    for _ in range(repeats):
        args = [jnp.asarray(t.numpy()) for t in (x, a, out)]
        fn = jax.jit(lambda *a: _jax_recurrence(*a))  # a new function: a compile, not jax.jit's cache
        clock = _Clock()
        jax.block_until_ready(fn(*args))
        first = clock.since()
        clock = _Clock()
        jax.block_until_ready(fn(*args))
        runs["jax"].append((*first, clock.since()[0]))
        clear_caches()
        with _config.CACHE_DIR.override("off"):
            times = []
            for _ in range(2):
                tx, ta, tout = x.to("tpu"), a.to("tpu"), out.to("tpu")
                lazytpu.sync()
                clock = _Clock()
                got = _torch_recurrence(tx, ta, tout).cpu()
                times.append(clock.since())
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        runs["lazytpu"].append((*times[0], times[1][0]))
    return {k: tuple(min(r[j] for r in v) for j in range(3)) for k, v in runs.items()}


def _as_jax(program, lifted: bool):
    """``jax.jit``'s arguments and function for a compiled ``program``: its
    numbers compiled in (``lifted=False``) or as parameters."""
    kinds = tuple(k.kind if lifted and type(k) is Constant else k for k in program.input_kinds)
    shim = types.SimpleNamespace(ops=program.ops, outputs=program.outputs, input_kinds=kinds)
    values = [
        k.value
        if type(k) is Constant
        else jax.ShapeDtypeStruct(k.shape, _dtypes.to_jax(k.dtype))
        if hasattr(k, "shape")
        else 0.5
        for k in program.input_kinds
    ]
    args, _ = program_args(shim, values, ())
    return lower_program(shim, torch.get_float32_matmul_precision()), args


def _jax_compile(program, lifted: bool) -> tuple[float, float]:
    fn, args = _as_jax(program, lifted)
    clock = _Clock()
    jax.jit(fn).lower(*args).compile()
    return clock.since()


def _llama_run(factory, kwargs, steps: int, lifted: bool) -> dict:
    """One cold run of the llama workload's first ``steps`` steps: per step,
    (wall s, cpu s), compile seconds and programs compiled; the first step's programs."""
    clear_caches()
    programs: list = []

    def keep(program, lowered):
        programs.append(program)

    engine.observe("compile", keep)
    run: dict = {"time": [], "compile_s": [], "compiled": []}
    try:
        workload = factory("tpu", **kwargs)
        lazytpu.sync()
        with _config.CACHE_DIR.override("off"), _lifted_only(lifted):
            for _ in range(steps):
                before = lazytpu.metrics.snapshot()
                clock = _Clock()
                workload.step().item()
                lazytpu.sync()
                run["time"].append(clock.since())
                after = lazytpu.metrics.snapshot()
                run["compile_s"].append(after["compile_seconds"] - before["compile_seconds"])
                run["compiled"].append(after["programs_compiled"] - before["programs_compiled"])
                run.setdefault("first", list(programs))
    finally:
        engine._OBSERVERS["compile"].remove(keep)
    return run


def measure_llama(repeats: int, steps: int = 4) -> dict:
    """The llama step's first sync, with numbers specialized and all lifted
    (interleaved), against ``jax.jit`` of its programs; the compiles of the next steps."""
    from benchmarks.workloads import WORKLOADS

    factory, kwargs, _ = WORKLOADS["llama"]
    runs: dict = {"lazytpu": [], "lazytpu lifted": [], "jax consts": [], "jax params": []}
    for _ in range(repeats):
        runs["lazytpu lifted"].append(_llama_run(factory, kwargs, steps, lifted=True))
        run = _llama_run(factory, kwargs, steps, lifted=False)
        runs["lazytpu"].append(run)
        for name, lifted in (("jax consts", False), ("jax params", True)):
            times = [_jax_compile(p, lifted) for p in run["first"]]
            runs[name].append((sum(t[0] for t in times), sum(t[1] for t in times)))
    first = runs["lazytpu"][-1]["first"]
    out = {
        "programs": len(first),
        "numbers": sum(type(k) is Constant for p in first for k in p.input_kinds),
        **{k: (min(r[0] for r in runs[k]), min(r[1] for r in runs[k])) for k in ("jax consts", "jax params")},
    }
    for name in ("lazytpu", "lazytpu lifted"):
        rs = runs[name]
        out[name] = (min(r["time"][0][0] for r in rs), min(r["time"][0][1] for r in rs))
        out[name + " compile"] = min(r["compile_s"][0] for r in rs)
        out[name + " all compile"] = min(sum(r["compile_s"]) for r in rs)
        out[name + " compiled"] = rs[-1]["compiled"]
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="250,500,1000", help="chain sizes ('' for none)")
    parser.add_argument("--recurrence", default="", help="samples of the lfilter recurrence, e.g. 96 ('' for none)")
    parser.add_argument("--llama", action="store_true", help="also the llama step's first sync")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"chain, fastest of {args.repeats}: wall s (cpu s); ratios of wall (of cpu)")
    print(f"{'ops':>5} {'lazytpu':>14} {'all lifted':>14} {'jax consts':>14} {'jax params':>14}", end="")
    print(f" {'lazytpu/consts':>16} {'lifted/consts':>16}")
    for n in (int(v) for v in args.ops.split(",") if v):
        r = measure_chain(n, args.repeats)
        lazy, lifted, consts, params = r["lazytpu"], r["lazytpu lifted"], r["jax consts"], r["jax params"]
        print(
            f"{r['ops']:>5} {lazy[0]:>6.2f} ({lazy[1]:>5.2f}) {lifted[0]:>6.2f} ({lifted[1]:>5.2f})"
            f" {consts[0]:>6.2f} ({consts[1]:>5.2f}) {params[0]:>6.2f} ({params[1]:>5.2f})"
            f" {lazy[0] / consts[0]:>8.2f} ({lazy[1] / consts[1]:>5.2f})"
            f" {lifted[0] / consts[0]:>8.2f} ({lifted[1] / consts[1]:>5.2f})",
            flush=True,
        )
    for n in (int(v) for v in args.recurrence.split(",") if v):
        r = measure_recurrence(n, args.repeats)
        lazy, jx = r["lazytpu"], r["jax"]
        print(
            f"recurrence of {n} samples, fastest of {args.repeats}: first call wall s (cpu s), second call ms\n"
            f"  lazytpu {lazy[0]:.2f} ({lazy[1]:.2f}), {lazy[2] * 1e3:.1f} ms; jax.jit {jx[0]:.2f} ({jx[1]:.2f}),"
            f" {jx[2] * 1e3:.1f} ms; lazytpu/jax first {lazy[0] / jx[0]:.2f} ({lazy[1] / jx[1]:.2f})",
            flush=True,
        )
    if args.llama:
        r = measure_llama(args.repeats)
        lazy, lifted, consts, params = r["lazytpu"], r["lazytpu lifted"], r["jax consts"], r["jax params"]
        print(
            f"llama, fastest of {args.repeats}: step 1 runs {r['programs']} programs, {r['numbers']} numbers"
            " compiled in; wall s (cpu s)\n"
            f"  lazytpu first step {lazy[0]:.2f} ({lazy[1]:.2f}), compiling {r['lazytpu compile']:.2f};"
            f" all lifted: {lifted[0]:.2f} ({lifted[1]:.2f}), compiling {r['lazytpu lifted compile']:.2f}\n"
            f"  jax.jit of its programs: numbers as constants {consts[0]:.2f} ({consts[1]:.2f}),"
            f" as parameters {params[0]:.2f} ({params[1]:.2f})\n"
            f"  first step/consts {lazy[0] / consts[0]:.2f} ({lazy[1] / consts[1]:.2f}),"
            f" compiling/consts {r['lazytpu compile'] / consts[0]:.2f}, params/consts {params[0] / consts[0]:.2f}\n"
            f"  steps 1-{len(r['lazytpu compiled'])}: programs compiled {r['lazytpu compiled']}, compiling"
            f" {r['lazytpu all compile']:.2f} s; all lifted {r['lazytpu lifted compiled']},"
            f" {r['lazytpu lifted all compile']:.2f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
