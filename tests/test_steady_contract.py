"""The steady-state contract of issue 4, point by point, where other tests
leave a gap: scalar lifting in every argument position (and shape-deciding
numbers staying static), the step-boundary flags read from the environment,
steady loops that read the loss before the step, the default on-disk cache
location, recompile explanations for dtypes and baked scalars, the README's
example output, program dumps and the cache controls.
"""

from __future__ import annotations

import math
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import STEP_PROGRAMS
from test_steady_state import _mlp_setup, _transformer_setup

import lazytpu
from lazytpu import _config, runtime

README = Path(__file__).resolve().parents[1] / "README.md"


def _python(code: str, env: dict, cwd=None, args=()) -> subprocess.CompletedProcess:
    out = subprocess.run(
        [sys.executable, *(["-c", code] if code else []), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return out


def _misses(fn) -> int:
    before = lazytpu.metrics.snapshot()["cache_misses"]
    fn()
    return lazytpu.metrics.snapshot()["cache_misses"] - before


# -- 1. scalar lifting -----------------------------------------------------------

# (cpu input) -> function of (tensor, python number); shapes used nowhere else.
_LIFTED = {
    "mul": lambda t, v: t * v,
    "rsub": lambda t, v: v - t,
    "add alpha=": lambda t, v: torch.add(t, t.flip(0), alpha=v),
    "clamp min/max": lambda t, v: t.clamp(min=-v, max=v),
    "lerp weight": lambda t, v: torch.lerp(t, t.flip(0), v),
    "addcmul value=": lambda t, v: torch.addcmul(t, t, t.flip(0), value=v),
    "pow exponent": lambda t, v: t.abs() ** v,
    "where scalar": lambda t, v: torch.where(t > 0, t, v),
    "masked_fill": lambda t, v: t.masked_fill(t < 0, v),
    "full": lambda t, v: torch.full(t.shape, v, device=t.device) + t,
    "fill_": lambda t, v: t.clone().fill_(v),
    "leaky_relu slope": lambda t, v: F.leaky_relu(t, v),
    "complex": lambda t, v: t.to(torch.complex64) * complex(v, -2 * v),
    "complex tensor": lambda t, v: torch.view_as_complex(t.reshape(-1, 2)) * complex(-v, v),
}


@pytest.mark.parametrize("case", list(_LIFTED))
def test_changing_python_floats_compile_nothing(case):
    fn = _LIFTED[case]
    cpu = torch.randn(6, 14, generator=torch.Generator().manual_seed(1))
    tpu = cpu.to("tpu")
    for v in (0.25, 0.5):  # warm-up
        fn(tpu, v).cpu()
    lazytpu.metrics.reset()
    for v in (0.125, 0.75, 1.5, 3.0):
        torch.testing.assert_close(fn(tpu, v).cpu(), fn(cpu, v))
    assert lazytpu.metrics.snapshot()["programs_compiled"] == 0


# Numbers that decide a shape, a dim or an algorithm stay static: each value
# is its own program, and its results are right.
_STATIC = {
    "sum dim": lambda t, n: t.reshape(3, 3, 3).sum(n - 2),
    "narrow length": lambda t, n: t.narrow(1, 0, n) * 2,
    "slice stop": lambda t, n: t.reshape(-1)[: n * 3] + 1,
    "arange float end": lambda t, n: torch.arange(0.0, n / 2, 0.5, device=t.device) + 1,
    "interpolate scale_factor": lambda t, n: F.interpolate(t[None], scale_factor=1 + n / 4, mode="nearest"),
}


@pytest.mark.parametrize("case", list(_STATIC))
def test_shape_deciding_numbers_stay_static(case):
    fn = _STATIC[case]
    cpu = torch.randn(3, 9, generator=torch.Generator().manual_seed(2))
    tpu = cpu.to("tpu")
    lazytpu.sync()
    for n in (2, 3, 4):
        assert _misses(lambda n=n: torch.testing.assert_close(fn(tpu, n).cpu(), fn(cpu, n))) >= 1, n


def _warmup_loop(device: str, steps: int) -> tuple[list[int], dict]:
    """SGD with momentum, a linear warm-up then cosine decay (a new learning
    rate every step), and a loss scaled by a changing Python float."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(), torch.nn.Linear(24, 3)).to(device)
    x, y = torch.randn(10, 12).to(device), torch.randn(10, 3).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    sched = torch.optim.lr_scheduler.SequentialLR(
        opt,
        [
            torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=4),
            torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps),
        ],
        milestones=[4],
    )
    compiled = []
    for step in range(steps):
        before = lazytpu.metrics.snapshot()["programs_compiled"]
        opt.zero_grad()
        loss = F.mse_loss(model(x), y) * (1.0 + math.sin(step))  # a loss scale that changes every step
        loss.backward()
        opt.step()
        sched.step()
        compiled.append(lazytpu.metrics.snapshot()["programs_compiled"] - before)
    return compiled, {k: v.detach().cpu() for k, v in model.state_dict().items()}


def test_warmup_schedule_compiles_nothing_after_the_first_steps():
    compiled, params = _warmup_loop("tpu", 10)
    _, expected = _warmup_loop("cpu", 10)
    # the optimizer program of the numbers that change is compiled once more, then never (Note [Scalar specialization])
    assert compiled[3] <= 1 and compiled[4:] == [0] * 6, compiled
    for name in expected:
        torch.testing.assert_close(params[name], expected[name], rtol=1e-4, atol=1e-5)


# -- 2. step boundaries, flags read from the environment --------------------------

_STEP_SCRIPT = """
import json, torch, lazytpu
torch.manual_seed(0)
model = torch.nn.Linear(8, 2).to("tpu")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8).to("tpu")
lazytpu.sync()
lazytpu.metrics.reset()
for _ in range(3):
    opt.zero_grad(); model(x).square().sum().backward(); opt.step()
after_steps = lazytpu.metrics.snapshot()
w = model.weight.cpu().tolist()
z = torch.zeros(4).to("tpu")
lazytpu.sync()
lazytpu.metrics.reset()
for _ in range(250):
    z = z + 1
capped = lazytpu.metrics.snapshot()["syncs"]
print(json.dumps({"steps": after_steps["syncs"], "executed": after_steps["programs_executed"], "w": w,
                  "capped": capped, "z": z.cpu().tolist()}))
"""


def _step_run(**env) -> dict:
    import json

    flags = ("LAZYTPU_SYNC_ON_OPTIMIZER_STEP", "LAZYTPU_MAX_PENDING_OPS", "LAZYTPU_STEP_SEGMENTS")
    out = _python(_STEP_SCRIPT, {**{k: v for k, v in os.environ.items() if k not in flags}, **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_step_boundary_flags_from_the_environment():
    off = _step_run(LAZYTPU_SYNC_ON_OPTIMIZER_STEP="0", LAZYTPU_MAX_PENDING_OPS="100", LAZYTPU_STEP_SEGMENTS="0")
    assert off["steps"] == {} and off["executed"] == 0  # three steps, nothing ran yet
    # at 100 pending ops, then at the same op each 50 more (Note [Graph depth])
    assert off["capped"] == {"graph_cap": 4} and off["z"] == [250.0] * 4
    whole = _step_run(LAZYTPU_STEP_SEGMENTS="0")  # a sync per step, a cap far above 250 ops
    # the third step's program waits for the next op, here the read of ``w`` (Note [Step boundary])
    assert whole["steps"] == {"optimizer_step": 3} and whole["executed"] == 2
    assert whole["capped"] == {} and whole["z"] == [250.0] * 4
    on = _step_run()  # the defaults: each step in three segments (Note [Step segments]), the last one waits
    assert on["steps"] == {"optimizer_step": 3, "segment": 6} and on["executed"] == 8
    assert on["w"] == off["w"] == whole["w"]


# -- 3. steady loops that read the loss before the step ---------------------------


@pytest.mark.parametrize("setup", [_mlp_setup, _transformer_setup], ids=["mlp", "transformer"])
def test_logging_before_the_step_with_clipping_and_warmup_stays_steady(setup):
    """A common loop shape: the loss is read (logged) before ``opt.step()``,
    gradients are clipped, the learning rate warms up: two programs per step
    (up to the read, then the update), the first in two segments (the
    forward, the backward: Note [Step segments]), and no compile after warm-up."""
    torch.manual_seed(0)
    model, loss_fn = setup()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=20)
    compiled, executed, losses = [], [], []
    for _ in range(8):
        before = lazytpu.metrics.snapshot()
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        sched.step()
        after = lazytpu.metrics.snapshot()
        compiled.append(after["programs_compiled"] - before["programs_compiled"])
        executed.append(after["programs_executed"] - before["programs_executed"])
    # the optimizer program of the numbers that change is compiled once more, then never (Note [Scalar specialization])
    assert compiled[3] <= 1 and compiled[4:] == [0] * 4, compiled
    assert executed[3:] == [2 if STEP_PROGRAMS == 1 else 3] * 5, executed
    assert losses[-1] < losses[0]


# -- 4. the default on-disk cache location -----------------------------------------

_CACHE_SCRIPT = """
import json, torch, lazytpu
model = torch.nn.Linear(5, 3).to("tpu")
opt = torch.optim.Adam(model.parameters(), lr=0.1)
x = torch.ones(2, 5).to("tpu")
for _ in range(2):
    opt.zero_grad(); model(x).sum().backward(); opt.step()
s = lazytpu.metrics.snapshot()
print(lazytpu.metrics.report())
print(json.dumps({k: s[k] for k in ("programs_compiled", "disk_cache_hits", "disk_cache_misses")}))
"""


def test_default_cache_dir_is_private_under_the_users_cache_and_reused(tmp_path):
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("LAZYTPU_CACHE_DIR", "XDG_CACHE_HOME")}
    env["HOME"] = str(tmp_path)
    first = _python(_CACHE_SCRIPT, env)
    cache = tmp_path / ".cache" / "lazytpu"
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    a = json.loads(first.stdout.strip().splitlines()[-1])
    assert a["disk_cache_hits"] == 0 and a["disk_cache_misses"] == a["programs_compiled"] > 0
    assert len([p for p in cache.iterdir() if len(p.name) == 64]) == a["programs_compiled"]
    second = _python(_CACHE_SCRIPT, env)
    b = json.loads(second.stdout.strip().splitlines()[-1])
    assert b["disk_cache_misses"] == 0 and b["disk_cache_hits"] == a["programs_compiled"]
    assert re.search(rf"disk_cache_hits\s+{b['disk_cache_hits']}\n", second.stdout)  # the report says so


# -- 5. recompile explanations -----------------------------------------------------


def test_explains_a_dtype_change_and_a_baked_integer():
    lazytpu.debug.clear()
    lazytpu.metrics.reset()
    a32, a64 = torch.randn(5, 3).to("tpu"), torch.randn(5, 3, dtype=torch.float64).to("tpu")
    lazytpu.sync()
    (a32.exp() ** 2).cpu()
    (a64.exp() ** 2).cpu()
    line = sys._getframe().f_lineno + 1
    (a64.exp() ** 3).cpu()  # an int exponent is a static argument: baked into the program
    dtype, baked = lazytpu.debug.explain()[-2:]
    assert "input dtype changed" in dtype and "float32[5, 3] -> float64[5, 3]" in dtype
    assert "static argument changed" in baked and "[_, 2] -> [_, 3]" in baked and f"{__file__}:{line}" in baked
    assert lazytpu.metrics.snapshot()["recompile_reasons"] == {"input dtype changed": 1, "static argument changed": 1}


def test_an_unrelated_program_is_not_called_a_recompile():
    lazytpu.debug.clear()
    (torch.randn(4, 7).to("tpu").sum(1).exp()).cpu()
    n = len(lazytpu.debug.explain())
    (torch.arange(12.0).to("tpu").reshape(3, 4).t().contiguous().cumsum(0).neg()).cpu()
    assert len(lazytpu.debug.explain()) == n


def test_source_lines_do_not_enter_the_program_key():
    x = torch.randn(5, 9).to("tpu")
    lazytpu.sync()
    (x.cos() * x).cpu()
    assert _misses(lambda: (x.cos() * x).cpu()) == 0  # the same program recorded at another line


def test_report_lists_the_top_recompile_reasons_first():
    lazytpu.metrics.reset()
    lazytpu.debug.clear()
    for n in (11, 12, 13):
        (torch.ones(n).to("tpu").sin() ** 2).cpu()  # two input shape changes
    (torch.ones(13).to("tpu").sin() ** 3).cpu()  # one static argument change
    report = lazytpu.metrics.report()
    body = report[report.index("recompile_reasons") :]
    assert re.search(r"recompile_reasons\s+3\n\s+input shape changed\s+2\n\s+static argument changed\s+1", body)


def test_no_stderr_without_the_debug_flag():
    code = (
        "import torch, lazytpu\nfor n in (3, 5):\n    (torch.ones(n).to('tpu') * 2).cpu()\n"
        "print(len(lazytpu.debug.explain()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "LAZYTPU_DEBUG"}
    out = _python(code, env)
    assert "lazytpu: compiling" not in out.stderr and out.stdout.strip() == "1"


def _readme_example() -> tuple[str, str]:
    text = README.read_text()
    section = text[text.index("## Debugging recompiles") :]
    section = section[: section.index("\n## ", 3)]
    script = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    shown = re.search(r"prints:\n\n```\n(.*?)```", section, re.S).group(1)
    return script, shown


def test_readme_shows_the_real_explanation(tmp_path):
    script, shown = _readme_example()
    (tmp_path / "train.py").write_text(script)
    out = _python("", dict(os.environ, LAZYTPU_DEBUG="recompile"), cwd=tmp_path, args=["train.py"])
    real = out.stderr[out.stderr.index("lazytpu: compiling") :]
    path = re.compile(r"\S*train\.py:")
    assert path.sub("train.py:", real).strip() == path.sub("train.py:", shown).strip()


# -- 6. graph inspection and dumps ----------------------------------------------------


def test_pending_graph_names_the_users_lines_and_only_what_is_asked():
    a = torch.ones(2, 3).to("tpu")
    lazytpu.sync()
    line = sys._getframe().f_lineno + 1
    b = (a * 2).sum(0)
    other = a.double().exp()
    text = lazytpu.debug.pending_graph(b)
    assert f"{__file__}:{line}" in text and "float32[2, 3]" in text and "float32[3]" in text
    assert "aten.exp" not in text and "float64" not in text  # only what b needs
    assert "aten.exp" in lazytpu.debug.pending_graph()  # everything pending
    dot = lazytpu.debug.pending_graph(b, format="dot")
    assert dot.startswith("digraph") and dot.rstrip().endswith("}") and dot.count("->") >= 2
    with pytest.raises(ValueError, match="format"):
        lazytpu.debug.pending_graph(b, format="svg")
    del other


def test_dump_dir_writes_a_pair_of_files_per_compiled_program(tmp_path):
    runtime.clear_caches()  # compile (or load) both programs again, whatever ran before
    with _config.DUMP_DIR.override(str(tmp_path)):
        (torch.arange(6.0).to("tpu") * 3 - 1).cpu()
        (torch.arange(6.0).to("tpu").reshape(2, 3).sum(1)).cpu()
    keys = {p.name.split(".")[0] for p in tmp_path.iterdir()}
    assert len(keys) == 2
    for key in keys:
        ir = (tmp_path / f"{key}.ir.txt").read_text()
        hlo = (tmp_path / f"{key}.stablehlo.mlir").read_text()
        assert ir.startswith("program:") and "stablehlo" in hlo
    irs = "".join(p.read_text() for p in tmp_path.glob("*.ir.txt"))
    assert "aten.mul.Tensor" in irs and "aten.sum.dim_IntList" in irs and f"{__file__}:" in irs


# -- 7. cache control -------------------------------------------------------------------


def test_cache_info_counts_hits_and_misses_and_disk_bytes():
    from lazytpu.runtime import persistent

    x = torch.randn(17, 3).to("tpu")
    lazytpu.sync()
    start = runtime.cache_info()
    (x.tanh() + x).cpu()
    missed = runtime.cache_info()
    (x.tanh() + x).cpu()
    hit = runtime.cache_info()
    assert missed["misses"] == start["misses"] + 1 and missed["entries"] == start["entries"] + 1
    assert hit["hits"] == missed["hits"] + 1 and hit["misses"] == missed["misses"]
    files = [p for p in persistent.cache_dir().iterdir() if len(p.name) == 64]
    assert hit["disk_entries"] == len(files) and hit["bytes"] == sum(p.stat().st_size for p in files) > 0


def test_clear_caches_clears_every_in_memory_cache_and_keeps_tensors_working():
    from lazytpu.frontend import metas, record, tensor
    from lazytpu.frontend.routes import views
    from lazytpu.ir import node

    cpu = torch.randn(4, 6)
    x = cpu.to("tpu")
    y = x.t() * 2  # pending across the clear
    (x[1:] + 1).cpu()
    tables = {
        "programs": lambda: runtime.cache_info()["entries"],
        "meta memo": lambda: len(metas._META_MEMO),
        "record plans": lambda: len(record.PLANS),
        "view plans": lambda: len(views._VIEW_PLANS),
        "tensor descriptors": lambda: len(tensor._DESCS),
        "op signatures": lambda: len(node._SIGS),
        "recompile history": lambda: len(lazytpu.debug._HISTORY.programs),
    }
    assert all(size() > 0 for size in tables.values())
    disk = runtime.cache_info()["disk_entries"]
    runtime.clear_caches()
    assert {name: size() for name, size in tables.items()} == dict.fromkeys(tables, 0)
    assert runtime.cache_info()["disk_entries"] == disk  # the disk cache only on request
    torch.testing.assert_close((y + x.t()).cpu(), cpu.t() * 3)
    torch.testing.assert_close((x[1:] + 1).cpu(), cpu[1:] + 1)
    x[0].mul_(2.5)  # in place, through a view, on a tensor described before the clear
    x.add_(1)
    expected = cpu.clone()
    expected[0] *= 2.5
    torch.testing.assert_close(x.cpu(), expected + 1)
