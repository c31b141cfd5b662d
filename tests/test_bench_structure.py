"""Structural facts behind the benchmark numbers (issue 5 item 5), untimed.

The workloads are imported from ``benchmarks.workloads`` (the code the suite
times), at small sizes: in defer mode a training step is one program, steady
state compiles nothing, and nothing falls back to CPU. The hand-written JAX
versions and lazytpu compute the same losses as CPU torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch
from conftest import STEP_PROGRAMS

import lazytpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repo root, where the benchmarks package lives

from benchmarks import jax_workloads as J  # noqa: E402
from benchmarks import report  # noqa: E402
from benchmarks import workloads as W  # noqa: E402

TRAINING = ("mlp_b32", "chain", "transformer")  # mlp_b256 is mlp_b32 at another batch size
WARMUP, STEPS = 3, 3


def _build(name: str, device: str) -> W.Workload:
    return W.WORKLOADS[name][0](device, **W.SMALL_SIZES[name])


@pytest.mark.parametrize("name", TRAINING)
def test_defer_step_is_one_program_without_recompiles_or_fallbacks(name):
    cpu = _build(name, "cpu")
    jw = J.BUILDERS[name](cpu.init_state)
    with torch.tpu.set_eager_mode("defer"):
        tpu = _build(name, "tpu")
        lazytpu.metrics.reset()
        for _ in range(WARMUP):
            expected = cpu.step().item()
            # Same math everywhere: lazytpu and the hand-written JAX match CPU torch
            # (step 0 checks the forward, later steps the optimizer update too).
            assert float(jw.step()) == pytest.approx(expected, rel=1e-4, abs=1e-5)
            assert tpu.step().item() == pytest.approx(expected, rel=1e-4, abs=1e-5)
            torch.tpu.synchronize()  # as the suite times a step (chain's gradients are read by nothing else)
        warm = lazytpu.metrics.snapshot()
        for _ in range(STEPS):
            tpu.step().item()
            torch.tpu.synchronize()
        snap = lazytpu.metrics.snapshot()
    assert snap["cpu_fallbacks"] == {}, f"CPU fallbacks: {snap['cpu_fallbacks']}"
    assert snap["programs_compiled"] == warm["programs_compiled"], "recompiled in steady state"
    executed = snap["programs_executed"] - warm["programs_executed"]
    assert executed == STEPS * (STEP_PROGRAMS if name != "chain" else 2), "not the same programs every step"
    assert jw.jitted._cache_size() == 1


@pytest.mark.parametrize("name", W.HF_FAMILIES)
def test_transformers_steps_match_cpu_without_recompiles_or_fallbacks(name):
    """The ``llama``, ``gpt2`` and ``bert`` workloads (issue 21): CPU torch's losses on tpu, no CPU
    fallback, nothing compiled in steady state. Their forward reads one value on the host
    (transformers' mask code asks whether the batch is packed, or padded: a sync), so a step is one
    program for each such read plus the step's own (its segments: Note [Step segments])."""
    cpu = _build(name, "cpu")
    with torch.tpu.set_eager_mode("defer"):
        tpu = _build(name, "tpu")
        for _ in range(WARMUP):
            assert tpu.step().item() == pytest.approx(cpu.step().item(), rel=1e-4, abs=1e-5)
        lazytpu.metrics.reset()
        for _ in range(STEPS):
            tpu.step().item()
        snap = lazytpu.metrics.snapshot()
    assert snap["cpu_fallbacks"] == {}, f"CPU fallbacks: {snap['cpu_fallbacks']}"
    assert snap["programs_compiled"] == 0, "recompiled in steady state"
    reads = snap["syncs"].get("item", 0)  # the host reads inside the forward (the step's ends in optimizer_step)
    assert snap["programs_executed"] == STEPS * STEP_PROGRAMS + reads and reads <= STEPS, snap["syncs"]


def test_steps_entry_point_smoke():
    """``python -m benchmarks.steps`` reports a step's host CPU by thread group and by phase."""
    cmd = [sys.executable, "-m", "benchmarks.steps", "--workloads", "mlp_b32", "--steps", "3"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    header = next(line.split() for line in proc.stdout.splitlines() if line.startswith("workload"))
    row = next(line.split() for line in proc.stdout.splitlines() if line.startswith("mlp_b32"))
    values = dict(zip([h for h in header if h != "|"], [v for v in row if v != "|"], strict=True))
    assert float(values["ops"]) > 0 and float(values["progs"]) == STEP_PROGRAMS
    assert float(values["host/op"].removesuffix("us")) > 0 and float(values["wraps"]) > 0
    phases = [float(values[k]) for k in ("torch", "record", "views", "sync")]
    assert all(p >= 0 for p in phases[1:]) and sum(phases) == pytest.approx(float(values["phased"]), abs=0.05)


@pytest.mark.parametrize("switch", ["constant_reads", "segments"])
def test_ab_entry_point_smoke(switch):
    """``python -m benchmarks.ab`` times a workload with a mechanism on and off, interleaved."""
    cmd = [sys.executable, "-m", "benchmarks.ab", "--switch", switch, "--workloads", "mlp_b32", "--steps", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = next(line.split() for line in proc.stdout.splitlines() if line.startswith("mlp_b32"))
    on, off, ratio, on_cpu, off_cpu, cpu_ratio = (float(v) for v in row[1:] if v != "|")
    assert on > 0 and off > 0 and on_cpu > 0 and off_cpu > 0
    assert ratio == pytest.approx(off / on, rel=0.01) and cpu_ratio == pytest.approx(off_cpu / on_cpu, rel=0.01)


def test_recording_hits_the_cache():
    x = torch.randn(16).to("tpu")
    with torch.tpu.set_eager_mode("defer"):
        for _ in range(2):
            y = W.op_chain(x, 32)
            lazytpu.sync()
        lazytpu.metrics.reset()
        y = W.op_chain(x, 32)
        lazytpu.sync()
        snap = lazytpu.metrics.snapshot()
    assert snap["ops_recorded"] == 32
    assert snap["programs_compiled"] == 0 and snap["programs_executed"] == 1
    assert snap["cpu_fallbacks"] == {}
    torch.testing.assert_close(y.cpu(), W.op_chain(x.cpu(), 32))


def test_suite_entry_point_smoke(tmp_path):
    """``python -m benchmarks`` runs end to end (tiny sizes, no chart: matplotlib is the bench extra)."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks",
        "--small",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--no-chart",
        "--no-progress",
        "--variants",
        "defer,defer_whole,cpu,jax,ideal,subclass,tpu_compile,tpu_compile_whole",
        "--workloads",
        "mlp_b32,record",
        "--pipeline",
        "2",
        "--pipeline-rounds",
        "2",
        "--out",
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "results.json").read_text())
    mlp = [c for c in data["cases"] if c["workload"] == "mlp_b32"]
    assert {c["status"] for c in mlp} == {"ok"}
    assert {t["result"] for t in data["targets"]} <= {"PASS", "FAIL", "N/A", "NO DATA"}
    assert "Targets" in proc.stdout
    # the optimizer workload is also timed in blocks, one warm-up block untimed (Note [Pipelined steady state])
    assert all(len(c["pipelined_s"]) == 2 and c["pipelined_median_s"] > 0 for c in mlp)
    assert all(c["compiled_in_pipelined"] == 0 for c in mlp)
    assert not any("pipelined_s" in c for c in data["cases"] if c["workload"] == "record")
    assert data["pipelined_ratios"]["mlp_b32"]["defer/jax"] > 0
    by_variant = {c["variant"]: c for c in mlp}
    assert by_variant["defer"]["programs_per_step"] == STEP_PROGRAMS  # Note [Step segments]
    assert by_variant["defer_whole"]["programs_per_step"] == 1
    assert by_variant["tpu_compile"]["programs_per_step"] == STEP_PROGRAMS  # a compiled step is cut too
    assert by_variant["tpu_compile_whole"]["programs_per_step"] == 1
    assert by_variant["subclass"]["loss_matches_cpu"] and data["ratios"]["mlp_b32"]["subclass/cpu"] > 0
    ratios = data["ratios"]["mlp_b32"]
    assert report._ceiling(ratios, "defer/cpu") == ratios["subclass/cpu"]  # Note [Ceilings]
    # Note [Ceilings] in report.py: the ideal backend is torch.compile's own host work, then the jax.jit
    # step (test_ideal_step_is_the_host_work_then_the_jax_step); two timed steps on a loaded CI machine
    # cannot show that it is slower than the jax.jit step alone (one run measured 0.22)
    assert data["ratios"]["mlp_b32"]["ideal/jax"] > 0
    assert data["pipelined_ratios"]["mlp_b32"]["ideal/jax"] > 0
    assert "Pipelined steady state: 2 steps per wait" in proc.stdout


def test_ideal_step_is_the_host_work_then_the_jax_step():
    """Note [Ceilings] in benchmarks/report.py: the ideal backend's step is never
    less work than the jax.jit step alone, by construction."""
    from benchmarks import floor  # noqa: PLC0415

    calls = []

    class Host:
        def step(self):
            calls.append("host")

    class Jitted:
        def step(self):
            calls.append("jax")
            return "loss"

    assert floor.ideal_step(Host(), Jitted())() == "loss"
    assert calls == ["host", "jax"]


@pytest.mark.parametrize("name", ("mlp_b32", "chain", "transformer", "llama"))
def test_forwarding_subclass_computes_cpu_torchs_steps(name):
    """The floor of an eager Python backend (Note [Forwarding floor] in benchmarks/subclass.py) runs
    each op on CPU torch behind a wrapper subclass: the same losses, parameters of its type."""
    cpu, floor = _build(name, "cpu"), _build(name, "subclass")
    for _ in range(2):
        assert floor.step().item() == cpu.step().item()
    if floor.model is not None:
        params = list(floor.model.parameters())
        assert params and all(type(p).__name__ == "ForwardingTensor" for p in params)
        assert all(isinstance(p, torch.nn.Parameter) for p in params)


def test_floor_entry_point_smoke():
    """``python -m benchmarks.floor`` (torch.compile's own host cost with a null backend, and the ideal
    backend's ratio to jax.jit) runs end to end."""
    cmd = [sys.executable, "-m", "benchmarks.floor", "--small", "--steps", "3", "--workloads", "mlp_b32,mlp_b256"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("mlp_b")]
    assert [r[0] for r in rows] == ["mlp_b32", "mlp_b256"]
    assert all(float(r[1]) > 0 and float(r[3]) > 0 for r in rows)  # null-backend ms, jax.jit ms
    # the ideal backend's ratios to the jax.jit step alone, per step and pipelined: printed, positive.
    # (Per step it cannot be faster in principle, but three steps on a loaded 2-core CI machine can
    # read below 1: a timing, not a structure, so the benchmark reports it and no test asserts it.)
    assert all(float(r[5]) > 0 and float(r[6]) > 0 for r in rows)


def test_compile_time_recurrence_smoke():
    """``python -m benchmarks.compile_time --recurrence N`` runs end to end; its lazytpu loop is
    CPU torch's (checked inside)."""
    cmd = [sys.executable, "-m", "benchmarks.compile_time", "--ops", "", "--recurrence", "6", "--repeats", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "recurrence of 6 samples" in proc.stdout and "lazytpu/jax first" in proc.stdout, proc.stdout


def test_programs_entry_point_smoke():
    """``python -m benchmarks.programs`` times the step's programs alone: the steps whose gradients the
    loop dropped have a program without them (Note [Step boundary]); the block's last step writes them."""
    cmd = [sys.executable, "-m", "benchmarks.programs", "--small", "--rounds", "2", "--calls", "2"]
    proc = subprocess.run([*cmd, "--workloads", "mlp_b32"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert [r.split("(")[0].split(" ms")[0].strip() for r in rows[:2]] == ["lazytpu step"] * 2
    assert "(9 of 10 in a block, 7 outputs)" in rows[0]  # 6 parameters and the loss
    assert "(1 of 10 in a block, 13 outputs)" in rows[1]  # and the 6 gradients
    assert [r.split("  ")[1].strip() for r in rows[2:]] == ["jax.jit step", "jax.jit step + its gradients"]
    assert all(float(r.split()[-3]) > 0 for r in rows)  # ms per call


def _torch_grads_as_jax_tree(name: str, model: torch.nn.Module):
    """``model``'s ``.grad`` in the parameter tree the hand-written JAX step uses."""
    grads = {k: p.grad for k, p in model.named_parameters()}
    if name == "transformer":
        return J._gpt_params(grads)
    linears = [k.split(".")[0] for k in grads if k.endswith(".weight")]
    return [(J._arr(grads[f"{i}.weight"]), J._arr(grads[f"{i}.bias"])) for i in linears]


@pytest.mark.parametrize("name", ("mlp_b32", "transformer"))
def test_jax_step_with_grads_returns_torchs_gradients(name):
    """The ``grads=True`` reference step (``benchmarks.programs``) returns the gradients torch
    leaves in ``.grad``, and the same losses as the suite's step."""
    cpu = _build(name, "cpu")
    jw, jgw = J.BUILDERS[name](cpu.init_state), J.BUILDERS[name](cpu.init_state, grads=True)
    for _ in range(2):
        expected = cpu.step().item()
        assert float(jw.step()) == pytest.approx(expected, rel=1e-4, abs=1e-5)
        assert float(jgw.step()) == pytest.approx(expected, rel=1e-4, abs=1e-5)
    assert jw.outputs()[-1] is None  # the suite's step keeps its gradients internal
    got = jax.tree_util.tree_leaves(jgw.outputs()[-1])
    want = jax.tree_util.tree_leaves(_torch_grads_as_jax_tree(name, cpu.model))
    assert len(got) == len(want) == len(list(cpu.model.parameters()))
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-6)


def test_device_check_script_names_what_the_suite_has():
    """benchmarks/device_check.sh (issue 21 item 6) is valid bash, and the
    workloads, variants and step modes it runs exist: a renamed one would only
    show on the device machine, where each run is scarce."""
    import re

    from benchmarks import settings, steps

    script = os.path.join(ROOT, "benchmarks", "device_check.sh")
    subprocess.run(["bash", "-n", script], check=True)
    text = open(script).read()
    (workloads,) = re.findall(r"for w in ([\w ]+); do", text)
    assert set(workloads.split()) <= set(W.WORKLOADS)
    (variants,) = re.findall(r"--variants ([\w,]+)", text)
    assert set(variants.split(",")) <= set(settings.VARIANTS)
    (modes,) = re.findall(r"for mode in ([\w ]+); do", text)
    for step_workloads in re.findall(r"benchmarks.steps --workloads ([\w,]+)", text):
        assert set(step_workloads.split(",")) <= set(steps.TRAINING)
    assert set(modes.split()) <= {"defer", "defer_whole", "strict"}


def test_phases_entry_point_smoke():
    """``python -m benchmarks.phases`` splits a step's wall time at its forward hook and optimizer
    step, for lazytpu and the forwarding floor, interleaved."""
    cmd = [sys.executable, "-m", "benchmarks.phases", "--workloads", "transformer", "--steps", "2"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {line.split()[0]: [float(v) for v in line.split()[1:]] for line in proc.stdout.splitlines()[2:]}
    for variant in ("defer", "subclass", "cpu"):
        *phases, step = rows[variant]
        assert len(phases) == 4 and all(p > 0 for p in phases) and step == pytest.approx(sum(phases), abs=0.01)
    *ratios, step_ratio = rows["defer/subclass"]
    assert step_ratio == pytest.approx(rows["defer"][-1] / rows["subclass"][-1], abs=0.006)  # printed to 2 places
