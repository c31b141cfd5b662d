"""Run every (workload, variant) case interleaved in one process and collect timings.

Note [Interleaving]: for one workload, all variants are set up first; then each
round runs one step of every variant, round-robin, starting one variant later
each round (so no variant always runs right after the same neighbour). A step
is timed with ``time.perf_counter`` around the step *and its wait*:
``loss.item()`` plus ``torch.tpu.synchronize()`` (lazytpu), ``block_until_ready``
on everything the step produced (JAX), ``loss.item()`` (CPU torch, synchronous).
Mode switches and metric snapshots happen outside the timed region. Round 0 is
the first-step time (compile included); rounds ``warmup..`` are steady state.
Ratios are medians of per-round ratios (paired neighbours in time, so load
spikes from other jobs on the machine mostly cancel).

Note [Pipelined steady state]: a step timed with its wait measures the
latency of one step: host work, then device work, in series. A training loop
that does not read the loss every step lets the host record step k+1 while
the device runs step k (lazytpu and JAX dispatch asynchronously), so its
throughput is bounded by the larger of the two, not their sum. For the
workloads with an optimizer (a step boundary each step), ``--pipeline N``
times blocks of N steps followed by one wait, interleaved like the steps
(one block per variant per round, starting one variant later each round); a
variant's first block is a warm-up. The time per step is the block's time /
N. The chain workload has no step boundary (its unread gradients would be
dead code for a lazy system) and is not pipelined.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import functools
import gc
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from typing import Any

import torch

# Set before any parallel work (Note [Equal threads] in settings.py).
_THREADS = int(os.environ.get("OMP_NUM_THREADS", "1"))
torch.set_num_threads(_THREADS)
with contextlib.suppress(RuntimeError):  # already set by an earlier import
    torch.set_num_interop_threads(1)

import jax  # noqa: E402

import lazytpu  # noqa: E402
from benchmarks import floor, report, subclass  # noqa: E402
from benchmarks import jax_workloads as J  # noqa: E402
from benchmarks import workloads as W  # noqa: E402

RECORD_SIZE = 16  # elements of the tensor the recording microbenchmark works on


class Unavailable(Exception):
    """This variant cannot run here (the reason is reported, the suite goes on)."""


class NotApplicable(Exception):
    """This variant has no meaning for this workload."""


class _Timer:
    """Wall-clock (``perf_counter``) and process CPU time (``process_time``: every
    thread of the process, so XLA's and OpenMP's workers count too)."""

    __slots__ = ("wall", "cpu")

    def __init__(self) -> None:
        self.cpu = time.process_time()
        self.wall = time.perf_counter()

    def stop(self, per: int = 1) -> tuple[float, float]:
        wall = time.perf_counter() - self.wall
        cpu = time.process_time() - self.cpu
        return wall / per, cpu / per


def _timed_block(n: int, step, wait) -> tuple[float, float]:
    """``n`` calls of ``step()``, then ``wait`` on the last one's result (Note [Pipelined
    steady state]): (wall, CPU) seconds per step."""
    timer = _Timer()
    for _ in range(n):
        out = step()
    wait(out)
    return timer.stop(per=n)


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


# ---------------------------------------------------------------------------
# cases
# ---------------------------------------------------------------------------
class Case:
    """One workload under one variant: set up, then stepped by the runner."""

    unit = "step"

    def __init__(self, workload: str, variant: str, kwargs: dict) -> None:
        self.workload, self.variant, self.kwargs = workload, variant, kwargs
        self.status, self.reason, self.trace = "ok", None, None
        self.times: list[float] = []  # wall-clock seconds per step (per op for ``unit == "op"``), by round
        self.cpu_times: list[float] = []  # process CPU seconds, likewise
        self.losses: list[float | None] = []
        self.compiled = self.compiled_steady = self.executed_steady = 0
        self.steady_steps = 0
        self.fallbacks: collections.Counter = collections.Counter()
        self.block_times: list[float] = []  # Note [Pipelined steady state]: wall seconds per step, by block
        self.block_cpu_times: list[float] = []
        self.compiled_pipelined = 0  # compiles during the timed blocks (should be 0)

    def setup(self) -> None: ...

    @contextlib.contextmanager
    def around(self):
        yield

    def timed_step(self) -> tuple[float, float, float | None]:
        """One step with its wait: (wall seconds, CPU seconds, loss)."""
        raise NotImplementedError

    def timed_block(self, n: int) -> tuple[float, float]:
        """``n`` steps, then one wait (Note [Pipelined steady state]): (wall, CPU) seconds per step."""
        raise NotImplementedError

    def counters(self) -> dict[str, Any]:
        return {"compiled": 0, "executed": 0, "fallbacks": {}}

    def fail(self, status: str, exc: BaseException) -> None:
        self.status, self.reason = status, _short(exc)
        self.trace = "".join(traceback.format_exception(exc)[-6:])

    def free(self) -> None:
        for name in ("w", "jw", "step", "x", "y"):
            if hasattr(self, name):
                delattr(self, name)


class TorchCase(Case):
    """Plain PyTorch on CPU, eager or with the forward (+ its backward) under torch.compile."""

    def setup(self) -> None:
        factory = W.WORKLOADS[self.workload][0]
        self.w = factory(subclass.DEVICE if self.variant == "subclass" else "cpu", **self.kwargs)
        if self.variant == "compile":
            self.w.compile(torch.compile)

    def timed_step(self):
        timer = _Timer()
        value = self.w.step().item()
        return *timer.stop(), value

    def timed_block(self, n: int):
        return _timed_block(n, self.w.step, lambda loss: loss.item())

    def counters(self):
        if self.variant != "compile":
            return super().counters()
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        return {"compiled": graphs, "executed": 0, "fallbacks": {}}


class LazyCase(Case):
    """lazytpu on the ``tpu`` device in defer or strict mode; ``defer_whole`` is
    defer with one program per step (no step segments: Note [Step segments] in
    lazytpu.engine)."""

    def setup(self) -> None:
        factory = W.WORKLOADS[self.workload][0]
        with self.around():
            self.w = factory("tpu", **self.kwargs)
            torch.tpu.synchronize()

    @contextlib.contextmanager
    def around(self):
        whole = self.variant == "defer_whole"
        with torch.tpu.set_eager_mode("defer" if whole else self.variant):
            with lazytpu._config.STEP_SEGMENTS.override(not whole):
                yield

    def timed_step(self):
        timer = _Timer()
        value = self.w.step().item()
        torch.tpu.synchronize()
        return *timer.stop(), value

    def timed_block(self, n: int):
        return _timed_block(n, self.w.step, lambda loss: (loss.item(), torch.tpu.synchronize()))

    def counters(self):
        snap = lazytpu.metrics.snapshot()
        return {
            "compiled": snap["programs_compiled"],
            "executed": snap["programs_executed"],
            "fallbacks": snap["cpu_fallbacks"],
        }


class TpuCompileCase(LazyCase):
    """lazytpu in defer mode with the forward (+ its backward) and the optimizer step under
    ``torch.compile(backend="tpu")``: each compiled graph is one node of the step's program
    (in step segments; ``tpu_compile_whole``: one program per step, Note [Step segments])."""

    def setup(self) -> None:
        factory = W.WORKLOADS[self.workload][0]
        with self.around():
            self.w = factory("tpu", **self.kwargs)
            self.w.compile(functools.partial(torch.compile, backend="tpu"), optimizer=True)
            torch.tpu.synchronize()

    @contextlib.contextmanager
    def around(self):
        with torch.tpu.set_eager_mode("defer"):
            with lazytpu._config.STEP_SEGMENTS.override(self.variant != "tpu_compile_whole"):
                yield


class JaxCase(Case):
    """The hand-written JAX step under one jax.jit."""

    def setup(self) -> None:
        factory = W.WORKLOADS[self.workload][0]
        if self.workload not in J.BUILDERS:
            raise NotApplicable("no hand-written JAX version of this workload")
        self.jw = J.BUILDERS[self.workload](factory("cpu", **self.kwargs).init_state)
        self.step = self.jw.step

    def timed_step(self):
        timer = _Timer()
        loss = self.step()
        self.jw.wait()
        wall, cpu = timer.stop()
        return wall, cpu, float(loss)

    def timed_block(self, n: int):
        return _timed_block(n, self.step, lambda _: self.jw.wait())

    def counters(self):
        return {"compiled": self.jw.jitted._cache_size(), "executed": 0, "fallbacks": {}}


class IdealCase(JaxCase):
    """The best a ``torch.compile`` backend can do here: each step runs torch.compile's own
    host work (the workload on CPU under a null backend, whose graphs compute nothing:
    ``benchmarks.floor``), then dispatches the hand-written ``jax.jit`` step as its program.
    A backend that costs nothing and whose program is exactly ``jax.jit``'s; ``ideal/jax``
    is the ceiling of ``tpu_compile/jax``."""

    def setup(self) -> None:
        super().setup()
        self.w = floor.null_workload(W.WORKLOADS[self.workload][0], self.kwargs)
        self.step = floor.ideal_step(self.w, self.jw)


class RecordCase(Case):
    """(d) ``n`` tiny elementwise ops; the time is per op.

    defer: recording only (the sync that runs them is outside the timer);
    strict: each op dispatched as its own program, with a wait at the end;
    cpu: CPU torch eager, for scale.
    """

    unit = "op"

    def setup(self) -> None:
        self.n = self.kwargs["n_ops"]
        if self.variant in ("compile", "tpu_compile", "tpu_compile_whole", "jax", "ideal"):
            raise NotApplicable("(d) measures per-op dispatch of eager torch code")
        if self.variant == "defer_whole":
            raise NotApplicable("(d) has no step to segment")
        x = torch.randn(RECORD_SIZE, generator=torch.Generator().manual_seed(W.SEED))
        self.x = W.to_device(x, "tpu" if self.lazy else self.variant)
        if self.lazy:
            torch.tpu.synchronize()

    @property
    def lazy(self) -> bool:
        return self.variant in ("defer", "strict")

    @contextlib.contextmanager
    def around(self):
        if not self.lazy:
            yield
        else:
            with torch.tpu.set_eager_mode(self.variant):
                yield

    def timed_step(self):
        timer = _Timer()
        y = W.op_chain(self.x, self.n)
        if self.variant == "strict":
            torch.tpu.synchronize()
        wall, cpu = timer.stop(per=self.n)
        if self.variant == "defer":
            # Run the recorded ops (a cache hit after round 0) and wait, untimed: an
            # execution left running would compete with the next round's recording.
            torch.tpu.synchronize()
        return wall, cpu, float(y[0].item())

    def counters(self):
        return LazyCase.counters(self) if self.lazy else super().counters()


CASE_TYPES = {
    "defer": LazyCase,
    "defer_whole": LazyCase,
    "strict": LazyCase,
    "cpu": TorchCase,
    "compile": TorchCase,
    "tpu_compile": TpuCompileCase,
    "tpu_compile_whole": TpuCompileCase,
    "jax": JaxCase,
    "ideal": IdealCase,
    "subclass": TorchCase,
}


# ---------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------
def _warm_frameworks(variants: list[str], compile_ok: list) -> None:
    """Pay each framework's one-time start-up on a trivial program, so first-step
    times measure the workload's compile; probe inductor (no C++ compiler, ...)."""
    jax.block_until_ready(jax.jit(lambda a: a * 2 + 1)(jax.numpy.ones(4, jax.numpy.float32)))
    t = torch.ones(4, device="tpu")
    (t * 2 + 1).cpu()
    if "compile" in variants:
        try:
            torch.compile(lambda a: torch.sin(a) * 2 + 1)(torch.ones(4)).sum().item()
            compile_ok.append(None)
        except Exception as exc:  # noqa: BLE001 (any failure means: unavailable, with the reason)
            compile_ok.append(f"torch.compile (inductor) failed on a trivial function: {_short(exc)}")


def _make_case(workload: str, variant: str, small: bool, record_ops: int, compile_error: str | None) -> Case:
    if workload == "record":
        case = RecordCase(workload, variant, {"n_ops": 16 if small else record_ops})
    else:
        kwargs = W.SMALL_SIZES[workload] if small else W.WORKLOADS[workload][1]
        case = CASE_TYPES[variant](workload, variant, dict(kwargs))
    try:
        if variant == "compile" and compile_error:
            raise Unavailable(compile_error)
        case.setup()
    except Unavailable as exc:
        case.status, case.reason = "unavailable", str(exc)
    except NotApplicable as exc:
        case.status, case.reason = "n/a", str(exc)
    except Exception as exc:  # noqa: BLE001 (a broken case is reported, the suite goes on)
        case.fail("error", exc)
    return case


def _rounds(cases: list[Case], rounds: int):
    """(round, case) in Note [Interleaving]'s order: round-robin over the cases still ok,
    starting one case later each round."""
    for r in range(rounds):
        live = [c for c in cases if c.status == "ok"]
        k = r % max(1, len(live))
        for case in live[k:] + live[:k]:
            yield r, case


def _run_workload(cases: list[Case], rounds: int, warmup: int, bar) -> None:
    for r, case in _rounds(cases, rounds):
        if bar is not None:
            bar.set_postfix_str(f"{case.workload}/{case.variant}", refresh=False)
        try:
            with case.around():
                before = case.counters()
                wall, cpu, value = case.timed_step()
                after = case.counters()
        except Exception as exc:  # noqa: BLE001
            case.fail("error", exc)
            if bar is not None:
                bar.update(rounds - r)
            continue
        case.times.append(wall)
        case.cpu_times.append(cpu)
        case.losses.append(value)
        compiled = after["compiled"] - before["compiled"]
        case.compiled += compiled
        for op, n in after["fallbacks"].items():
            case.fallbacks[op] += n - before["fallbacks"].get(op, 0)
        if r >= warmup:
            case.steady_steps += 1
            case.compiled_steady += compiled
            case.executed_steady += after["executed"] - before["executed"]
        if bar is not None:
            bar.update(1)


PIPELINED = ("mlp_b32", "mlp_b256", "transformer")  # the workloads with an optimizer step


def _run_pipelined(cases: list[Case], n: int, rounds: int, bar) -> None:
    """One warm-up block, then ``rounds`` timed blocks per case (Note [Pipelined steady state])."""
    for r, case in _rounds(cases, rounds + 1):
        if bar is not None:
            bar.set_postfix_str(f"{case.workload}/{case.variant} pipelined", refresh=False)
        try:
            with case.around():
                before = case.counters()["compiled"]
                wall, cpu = case.timed_block(n)
                compiled = case.counters()["compiled"] - before
        except Exception as exc:  # noqa: BLE001
            case.fail("error", exc)
            continue
        if r:
            case.block_times.append(wall)
            case.block_cpu_times.append(cpu)
            case.compiled_pipelined += compiled
        if bar is not None:
            bar.update(n)


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def _case_result(case: Case, warmup: int) -> dict[str, Any]:
    steady = case.times[warmup:]
    out: dict[str, Any] = {
        "workload": case.workload,
        "variant": case.variant,
        "status": case.status,
        "reason": case.reason,
        "unit": case.unit,
        "steady_steps": len(steady),
    }
    if case.trace:
        out["trace"] = case.trace
    if case.times:
        if len(steady) >= 2:
            p25, _, p75 = statistics.quantiles(steady, n=4)
        else:
            p25 = p75 = steady[0] if steady else None
        out.update(
            median_s=statistics.median(steady) if steady else None,
            p25_s=p25,
            p75_s=p75,
            cpu_median_s=statistics.median(case.cpu_times[warmup:]) if steady else None,
            first_s=case.times[0],
            times_s=case.times,
            cpu_times_s=case.cpu_times,
            loss_first=case.losses[0],
            loss_last=case.losses[-1],
            programs_compiled=case.compiled,
            compiled_in_steady_state=case.compiled_steady,
            cpu_fallbacks=dict(+case.fallbacks),
        )
        if isinstance(case, LazyCase) and case.steady_steps:
            out["programs_per_step"] = case.executed_steady / case.steady_steps
    if case.block_times:
        out.update(
            pipelined_median_s=statistics.median(case.block_times),
            pipelined_cpu_median_s=statistics.median(case.block_cpu_times),
            pipelined_s=case.block_times,
            pipelined_cpu_s=case.block_cpu_times,
            compiled_in_pipelined=case.compiled_pipelined,
        )
    return out


def main(args, env: dict) -> int:
    small = args.small
    rounds = args.warmup + args.steps
    started = datetime.datetime.now(datetime.UTC)
    load_before = os.getloadavg()
    wall = time.perf_counter()
    compile_probe: list = []
    _warm_frameworks(args.variants, compile_probe)
    compile_error = compile_probe[0] if compile_probe else None
    lazytpu.metrics.reset()

    bar = None
    if not args.no_progress:
        from tqdm import tqdm  # noqa: PLC0415

        blocks = sum(w in PIPELINED for w in args.workloads) * (args.pipeline_rounds + 1) * args.pipeline
        bar = tqdm(
            total=len(args.variants) * (len(args.workloads) * rounds + blocks),
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            desc="benchmarks",
        )
    results: list[dict[str, Any]] = []
    for workload in args.workloads:
        if bar is not None:
            bar.set_description(f"{workload}: setup")
        cases = [_make_case(workload, v, small, args.record_ops, compile_error) for v in args.variants]
        if bar is not None:
            bar.update(rounds * sum(c.status != "ok" for c in cases))
            bar.set_description(workload)
        _run_workload(cases, rounds, args.warmup, bar)
        if args.pipeline and workload in PIPELINED:
            _run_pipelined(cases, args.pipeline, args.pipeline_rounds, bar)
        results += [_case_result(c, args.warmup) for c in cases]
        for c in cases:
            c.free()
        del cases
        gc.collect()
        with contextlib.suppress(Exception):
            lazytpu.sync()
    if bar is not None:
        bar.close()

    dirty = _git("status", "--porcelain", "--", "lazytpu")
    meta = {
        "started_utc": started.isoformat(timespec="seconds"),
        "wall_s": round(time.perf_counter() - wall, 1),
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "lazytpu_uncommitted_files": len(dirty.splitlines()) if dirty else 0,
        "lazytpu_uncommitted": dirty.splitlines() if dirty else [],
        "argv": sys.argv[1:],
        "steps": args.steps,
        "warmup": args.warmup,
        "small": small,
        "record_ops": args.record_ops,
        "pipeline": args.pipeline,
        "pipeline_rounds": args.pipeline_rounds,
        "threads": env["threads"],
        "cores_available": env["cores_available"],
        "env": env["env"],
        "torch_num_threads": torch.get_num_threads(),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "jax": jax.__version__,
            "lazytpu": lazytpu.__version__,
        },
        "device": torch.tpu.get_device_name(),
        "cpu": _cpu_model(),
        "platform": platform.platform(),
    }
    data = report.build(meta, results)
    print(report.table(data))
    os.makedirs(args.out, exist_ok=True)
    json_path = report.write_json(data, args.out)
    paths = [json_path]
    if not args.no_chart:
        paths.append(report.chart(data, args.out))
    print("\nwrote " + ", ".join(os.path.relpath(p) for p in paths))
    return 0
