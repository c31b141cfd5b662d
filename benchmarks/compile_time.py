"""Compile time: lazytpu's first sync of an op chain against ``jax.jit`` of the same chain (issue 21 item 4).

    python -m benchmarks.compile_time [--ops 250,500,1000]

The chain is ``y = tanh(y @ W) * 0.5 + y * 0.5 + i * 1e-3`` (6 ops a round,
``ops // 6`` rounds) on an 8x64 input. Three timings per size, each from a
cold start of its own (a fresh ``jax.jit``; lazytpu's caches cleared):

- ``lazytpu``: recording the chain, then its first sync (compile and run);
- ``jax consts``: ``jax.jit`` of the chain in ``jax.numpy`` with its Python
  numbers as constants, as a JAX user writes it (XLA folds them in);
- ``jax params``: the same with the numbers as program parameters, the
  program lazytpu builds (Note [Scalar lifting] in lazytpu.ir.node: a number
  is an input, so a changing one reuses the program) — the ceiling of
  lazytpu's program as it is.

Trace and lower, then XLA's compile, are shown apart for ``jax.jit``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

import lazytpu
from lazytpu import _config
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


def measure(ops: int) -> dict:
    rounds = ops // OPS_PER_ROUND
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(8, 64, generator=gen), torch.randn(64, 64, generator=gen) * 0.1
    numbers = [v for i in range(rounds) for v in (0.5, 0.5, i * 1e-3)]
    xj, wj = jnp.asarray(x.numpy()), jnp.asarray(w.numpy())
    out = {"ops": rounds * OPS_PER_ROUND}

    def as_f32(v):
        return jnp.float32(v)

    for name, fn, args in (
        ("jax consts", lambda a, b: _jax_chain(a, b, [as_f32(v) for v in numbers]), (xj, wj)),
        ("jax params", lambda a, b, v: _jax_chain(a, b, [v[j].astype(jnp.float32) for j in range(len(numbers))]),
         (xj, wj, np.asarray(numbers))),
    ):  # fmt: skip
        start = time.perf_counter()
        lowered = jax.jit(fn).lower(*args)
        traced = time.perf_counter()
        jax.block_until_ready(lowered.compile()(*args))
        out[name] = (traced - start, time.perf_counter() - traced)

    clear_caches()
    tx, tw = x.to("tpu"), w.to("tpu")
    lazytpu.sync()
    before = lazytpu.metrics.snapshot()["compile_seconds"]
    with _config.CACHE_DIR.override("off"):  # a compile, not a load from the disk cache
        start = time.perf_counter()
        y = _torch_chain(tx, tw, rounds)
        recorded = time.perf_counter()
        got = y.cpu()
    out["lazytpu"] = (recorded - start, time.perf_counter() - recorded)
    out["lazytpu_compile_s"] = lazytpu.metrics.snapshot()["compile_seconds"] - before
    torch.testing.assert_close(got, _torch_chain(x, w, rounds), rtol=1e-4, atol=1e-5)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="250,500")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"{'ops':>5} {'lazytpu rec+sync':>17} {'(compile)':>10} {'jax consts':>16} {'jax params':>16}"
          f" {'lazytpu/consts':>15} {'lazytpu/params':>15}")  # fmt: skip
    for n in (int(v) for v in args.ops.split(",")):
        r = measure(n)
        lazy = sum(r["lazytpu"])
        consts, params = sum(r["jax consts"]), sum(r["jax params"])
        print(
            f"{r['ops']:>5} {r['lazytpu'][0]:>7.2f}+{r['lazytpu'][1]:>6.2f} s {r['lazytpu_compile_s']:>8.2f} s"
            f" {r['jax consts'][0]:>5.2f}+{r['jax consts'][1]:>6.2f} s"
            f" {r['jax params'][0]:>5.2f}+{r['jax params'][1]:>6.2f} s"
            f" {lazy / consts:>15.2f} {lazy / params:>15.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
