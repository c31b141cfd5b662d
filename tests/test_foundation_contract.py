"""Issue 2's contract, the points no other test file pins down: packaging and the
README's commands, the platform and async dispatch, dtype conversion and the
in-place forms against CPU torch in both modes, errors at the line, cpu/tpu
mixing, the fallback's warning, 64-bit values."""

from __future__ import annotations

import configparser
import importlib
import os
import re
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import hypothesis
import jax
import pytest
import torch
import torch.nn.functional as F
from conftest import STEP_PROGRAMS, mode, no_fallback, run_both
from hypothesis import given
from hypothesis import strategies as st
from packaging.requirements import Requirement

import lazytpu
import lazytpu.frontend.dispatch

ROOT = Path(__file__).resolve().parent.parent
F16, BF16, F32, F64, I32, I64, B = (
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int32,
    torch.int64,
    torch.bool,
)
_HEALTH = [hypothesis.HealthCheck.function_scoped_fixture]


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=dict(os.environ, **env)
    )


# -- 1. packaging ---------------------------------------------------------------


def _setup_cfg() -> configparser.ConfigParser:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return cfg


def _requirements(text: str) -> dict[str, Requirement]:
    reqs = [Requirement(line.strip()) for line in text.strip().splitlines() if line.strip()]
    return {r.name: r for r in reqs}


def test_setup_cfg_requirements_and_extras():
    cfg = _setup_cfg()
    install = _requirements(cfg["options"]["install_requires"])
    assert {"torch", "jax", "jaxlib", "numpy", "attrs"} <= set(install)
    assert install["torch"].specifier.contains("2.13.0")
    extras = cfg["options.extras_require"]
    dev = _requirements(extras["dev"])
    assert {"pytest", "hypothesis", "ruff"} <= set(dev)
    tpu = _requirements(extras["tpu"])
    assert "tpu" in tpu["jax"].extras


def test_build_system_and_layout():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r"^\[build-system\]$", pyproject, flags=re.M)
    assert "setuptools.build_meta" in pyproject
    for sub in ("ir", "fusion", "lowering", "runtime"):
        assert (ROOT / "lazytpu" / sub / "__init__.py").is_file(), sub
    for folder in ("tests", "benchmarks", "notebooks"):
        assert (ROOT / folder).is_dir(), folder


# -- 2. README quickstart, make demo / make test, .ci/run ------------------------


def _make_rule(makefile: str, target: str) -> str:
    match = re.search(rf"^{re.escape(target)}:.*?(?=^\S|\Z)", makefile, flags=re.M | re.S)
    assert match, target
    return match.group(0)


def test_quickstart_is_make_demo_and_make_test():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"## Quickstart\s*```bash\n(.*?)```", readme, flags=re.S)
    assert block
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    setup = _make_rule(makefile, "$(STAMP)")
    assert "-m venv" in setup
    torch_pin = setup.index("torch==2.13.0")
    assert torch_pin < setup.index("-e '.[dev]'")
    for target in ("demo", "test"):
        assert _make_rule(makefile, target).startswith(f"{target}: $(STAMP)")
    assert "examples/demo.py" in _make_rule(makefile, "demo")
    assert "pytest" in _make_rule(makefile, "test")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert os.access(ROOT / ".ci" / "run", os.X_OK)
    assert ci[-1].strip() == "make test"


def test_demo_trains_in_both_modes_and_prints_the_report():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py")], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr
    row = re.compile(r"^(strict|defer)\s+([\d.]+)s\s+([\d.]+)ms\s+(\d+)\s+(\d+)\s+([\d.]+)\s", flags=re.M)
    rows = {m.group(1): m.groups()[1:] for m in row.finditer(out.stdout)}
    assert set(rows) == {"strict", "defer"}, out.stdout  # step times, programs compiled, programs per step
    assert all(int(r[2]) >= 1 for r in rows.values())
    assert float(rows["defer"][4]) == STEP_PROGRAMS  # a defer step: one program, or its segments
    assert float(rows["strict"][4]) > 10
    for key in ("programs_compiled", "programs_executed", "cache_hits", "syncs"):
        assert key in out.stdout


# -- 3. the device ----------------------------------------------------------------


def test_get_device_name_names_the_pjrt_platform():
    platform = lazytpu.runtime.platform_name()
    assert platform == jax.local_devices()[0].platform
    assert platform in torch.tpu.get_device_name()
    assert platform in torch.tpu.get_device_name(0)
    assert torch.tpu.device_count() == len(jax.local_devices(backend=platform))


def test_print_and_to_cpu(capsys):
    cpu = torch.tensor([[1.5, -2.0], [0.0, 3.25]], dtype=F64)
    t = cpu.to("tpu") * 1  # pending in defer mode
    print(t)
    assert (
        capsys.readouterr().out
        == "tensor([[ 1.5000, -2.0000],\n        [ 0.0000,  3.2500]], device='tpu:0', dtype=torch.float64)\n"
    )
    back = t.to("cpu")
    assert back.device.type == "cpu" and back.dtype == F64
    assert torch.equal(back, cpu)


# -- 4. modes ---------------------------------------------------------------------


@pytest.mark.parametrize("value", ["strict_blocking", "1"])
def test_invalid_mode_fails_at_import_naming_the_valid_values(value):
    out = _python("import torch\nimport lazytpu\nprint('imported')", TORCHTPU_EAGER_MODE=value)
    assert out.returncode != 0 and "imported" not in out.stdout
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError:") and "TORCHTPU_EAGER_MODE" in last, last
    assert all(name in last for name in ("defer", "strict", "strict-blocking")), last
    assert "line 2, in <module>" in out.stderr  # raised by `import lazytpu`


# -- 4/6. modes: strict dispatches asynchronously, strict-blocking waits ----------


def test_strict_dispatch_is_asynchronous_and_strict_blocking_waits():
    x = torch.randn(2000, 2000, device="tpu")
    lazytpu.sync()
    ready = {}
    for name in ("strict", "strict-blocking"):
        with torch.tpu.set_eager_mode(name):
            y = x @ x  # one program of ~16 GFLOP: far longer than returning from the call
            ready[name] = y._lt_storage.value.buffer.is_ready()
            y.cpu()
    assert ready == {"strict": False, "strict-blocking": True}


# -- 6. platform choice -----------------------------------------------------------


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_absent_platform_is_a_runtime_error_naming_what_is_present(platform):
    out = _python("import torch, lazytpu; print(torch.ones(2, device='tpu').sum().item())", LAZYTPU_PLATFORM=platform)
    try:
        present = bool(jax.local_devices(backend=platform))
    except RuntimeError:
        present = False
    if present:
        assert out.returncode == 0, out.stderr
        return
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError:"), last
    assert f"LAZYTPU_PLATFORM='{platform}'" in last
    assert f"present: {lazytpu.runtime.platform_name()}" in last


def test_platform_cpu_is_chosen_when_asked():
    out = _python(
        "import torch, lazytpu; print(torch.tpu.get_device_name(), (torch.ones(3, device='tpu') * 2).sum().item())",
        LAZYTPU_PLATFORM="cpu",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "6.0"
    assert "PJRT cpu" in out.stdout


# -- 8. dtype conversion, against CPU torch in both modes --------------------------

CONVERT_TO = (F32, F64, I64, I32, B, F16, BF16)
METHOD = {F32: "float", F64: "double", I64: "long", I32: "int", B: "bool", F16: "half", BF16: "bfloat16"}
CONVERT_SHAPES = ((2, 3), (), (0,), (4, 1))


@st.composite
def _values(draw, shape: tuple, dtype: torch.dtype, special: bool) -> torch.Tensor:
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16), label="seed"))
    if dtype is B:
        return torch.rand(shape, generator=gen) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(-300, 300, shape, generator=gen, dtype=dtype)
    values = (torch.randn(shape, generator=gen, dtype=F64) * 50).to(dtype).flatten()
    edges = (0.0, -0.0, 0.5, -0.5, 2.5, -1.7, 1e-3) + (
        (float("inf"), float("-inf"), float("nan"), 7e4) if special else ()
    )
    for i, v in enumerate(draw(st.lists(st.sampled_from(edges), max_size=values.numel()), label="edges")):
        values[i] = v
    return values.reshape(shape)


@hypothesis.settings(suppress_health_check=_HEALTH)
@given(data=st.data())
def test_dtype_conversion_matches_cpu(eager_mode, data):
    src = data.draw(st.sampled_from((F32, F64, I64, B)), label="src")
    dst = data.draw(st.sampled_from(CONVERT_TO), label="dst")
    shape = data.draw(st.sampled_from(CONVERT_SHAPES), label="shape")
    # float -> int of inf/nan is undefined behaviour in C++ (CPU torch's result is arbitrary)
    x = data.draw(_values(shape, src, special=dst.is_floating_point or dst is B), label="x")
    grad = src.is_floating_point and dst.is_floating_point
    x.requires_grad_(grad)

    def convert(t):
        return t.to(dst), t.type(dst), getattr(t, METHOD[dst])(), t.to(dtype=dst, copy=True), t.to("tpu", dst) * 1

    with no_fallback():
        run_both(convert, x, mode_name=eager_mode, grad=grad)


# -- 8. in-place forms on tensors that are not views ------------------------------

INPLACE = {
    "add_": lambda x, y, z: x.clone().add_(y, alpha=2),
    "add_scalar_": lambda x, y, z: x.clone().add_(3),
    "mul_": lambda x, y, z: x.clone().mul_(y),
    "mul_scalar_": lambda x, y, z: x.clone().mul_(-3),
    "zero_": lambda x, y, z: x.clone().mul_(y).zero_(),
    "fill_": lambda x, y, z: x.clone().fill_(2),
    "fill_tensor_": lambda x, y, z: x.clone().fill_(z),
    "copy_": lambda x, y, z: x.clone().copy_(y),
    "copy_other_dtype_": lambda x, y, z: x.clone().copy_(y.to(F64 if y.dtype is F32 else F32)),
    "chain": lambda x, y, z: x.clone().mul_(y).add_(z).sub_(x, alpha=2).mul_(z),
}
INPLACE_SHAPES = (((2, 3), (2, 3)), ((2, 3), (3,)), ((2, 3), ()), ((), ()), ((0, 3), (3,)))


@pytest.mark.parametrize("name", sorted(INPLACE))
@hypothesis.settings(max_examples=4, suppress_health_check=_HEALTH)
@given(data=st.data())
def test_inplace_forms_match_cpu(name, eager_mode, data):
    dtype = data.draw(st.sampled_from((F32, F64, I64)), label="dtype")
    x_shape, y_shape = data.draw(st.sampled_from(INPLACE_SHAPES), label="shapes")
    x, y, z = (data.draw(_values(s, dtype, special=False)) for s in (x_shape, y_shape, ()))
    grad = dtype.is_floating_point
    if grad:  # a gradient for each input the op's result depends on (as CPU torch finds)
        leaves = [t.clone().requires_grad_() for t in (x, y, z)]
        INPLACE[name](*leaves).sum().backward()
        for t, leaf in zip((x, y, z), leaves):
            t.requires_grad_(leaf.grad is not None)
    with no_fallback():
        run_both(INPLACE[name], x, y, z, mode_name=eager_mode, grad=grad)


def test_copy_between_cpu_and_tpu_in_place(eager_mode):
    with mode(eager_mode):
        t = torch.zeros(2, 3, device="tpu")
        t.copy_(torch.arange(3))  # cpu int64 source, broadcast, converted
        t.add_(torch.tensor(0.5))  # a 0-d cpu tensor
        host = torch.empty(2, 3, dtype=F64)
        host.copy_(t)  # into a cpu destination
    expected = torch.zeros(2, 3).copy_(torch.arange(3)).add_(0.5)
    assert t.device.type == "tpu"
    torch.testing.assert_close(t.cpu(), expected)
    torch.testing.assert_close(host, expected.double())


# -- 8. CPU fallback: counted per op, warned once per op -------------------------

_LIB = torch.library.Library("lazytpu_contract_fallback", "DEF")
_LIB.define("plus_one(Tensor x) -> Tensor")
_LIB.define("times_three(Tensor x) -> Tensor")
_LIB.impl("plus_one", lambda x: x + 1, "CPU")
_LIB.impl("times_three", lambda x: x * 3, "CPU")
_OPS = torch.ops.lazytpu_contract_fallback


def test_fallback_warns_once_per_op_and_counts_every_call(eager_mode):
    x = torch.randn(3, 2)
    lazytpu.metrics.reset()
    with mode(eager_mode), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fallback_warned = lazytpu.frontend.routes.fallback._WARNED
        fallback_warned.difference_update(
            {"lazytpu_contract_fallback.plus_one.default", "lazytpu_contract_fallback.times_three.default"}
        )
        t = x.to("tpu") * 2  # a pending input: materialized for the fallback
        a = _OPS.plus_one(t)
        b = _OPS.plus_one(_OPS.times_three(a))
        c = _OPS.times_three(b) - 1
        torch.testing.assert_close(c.cpu(), ((x * 2 + 1) * 3 + 1) * 3 - 1)
    assert a.device.type == b.device.type == c.device.type == "tpu"
    assert lazytpu.metrics.snapshot()["cpu_fallbacks"] == {
        "lazytpu_contract_fallback.plus_one.default": 2,
        "lazytpu_contract_fallback.times_three.default": 2,
    }
    messages = [str(w.message) for w in caught if "lazytpu_contract_fallback" in str(w.message)]
    assert len(messages) == 2, messages
    assert sum("plus_one" in m for m in messages) == 1 and sum("times_three" in m for m in messages) == 1


# -- 9. errors at the line that caused them ---------------------------------------

# name -> (shapes of two randn operands, the offending call)
LINE_ERRORS = {
    "broadcast": (((2, 3), (4,)), lambda a, b: a + b),
    "mm": (((2, 3), (4, 5)), lambda a, b: torch.mm(a, b)),
    "matmul": (((2, 3), (4,)), lambda a, b: a @ b),
    "view": (((2, 3), (4,)), lambda a, b: a.view(4)),
    "cat": (((2, 3), (2, 4)), lambda a, b: torch.cat([a, b])),
    "inplace_broadcast": (((2, 3), (4, 3)), lambda a, b: a.add_(b)),
    "select_range": (((2, 3), (4,)), lambda a, b: a.select(0, 5)),
    "linear": (((2, 3), (4, 5)), lambda a, b: F.linear(a, b)),
}


@pytest.mark.parametrize("name", sorted(LINE_ERRORS))
def test_error_raised_at_the_offending_call_before_any_sync(name, eager_mode):
    shapes, call = LINE_ERRORS[name]
    with pytest.raises(Exception) as cpu_err:
        call(*(torch.randn(s) for s in shapes))
    with mode(eager_mode):
        a, b = (torch.randn(s, device="tpu") for s in shapes)
        pending = a._lt_storage.pending
        before = lazytpu.metrics.snapshot()
        with pytest.raises(type(cpu_err.value)) as tpu_err:
            call(a, b)
        after = lazytpu.metrics.snapshot()
        assert a._lt_storage.pending == pending  # nothing was materialized
    assert pending == (eager_mode == "defer")
    assert after["syncs"] == before["syncs"]
    assert after["programs_executed"] == before["programs_executed"]
    assert str(tpu_err.value) == str(cpu_err.value)
    frames = traceback.extract_tb(tpu_err.tb)
    assert frames[0].line == "call(a, b)"
    assert frames[1].name == "<lambda>" and frames[1].lineno == call.__code__.co_firstlineno
    torch.testing.assert_close((a * 2).cpu(), a.cpu() * 2)  # the state is still usable


# -- 9. mixing cpu and tpu tensors -------------------------------------------------

MIXED = {
    "add": lambda t, c: t + c,
    "radd": lambda t, c: c + t,
    "mul": lambda t, c: torch.mul(c, t),
    "maximum": lambda t, c: torch.maximum(t, c),
    "where_cond": lambda t, c: torch.where(c > 0, t, t),
    "where_other": lambda t, c: torch.where(t > 0, t, c),
    "addcmul": lambda t, c: torch.addcmul(t, t, c),
    "mm": lambda t, c: torch.mm(t, c.T),
    "matmul": lambda t, c: c @ t.T,
    "linear": lambda t, c: F.linear(t, c),
    "cat": lambda t, c: torch.cat([t, c]),
    "stack": lambda t, c: torch.stack([c, t]),
    "add_into_tpu": lambda t, c: t.clone().add_(c),
    "add_into_cpu": lambda t, c: c.clone().add_(t),
    "cross_entropy_target": lambda t, c: F.cross_entropy(t, c.argmax(1)),
}


@pytest.mark.parametrize("name", sorted(MIXED))
def test_mixing_cpu_and_tpu_raises_the_cuda_error(name, eager_mode):
    with mode(eager_mode):
        t = torch.randn(2, 3, device="tpu")
        with pytest.raises(RuntimeError, match=r"^Expected all tensors to be on the same device, but"):
            MIXED[name](t, torch.randn(2, 3))


# ops that take a CPU scalar or 0-d CPU tensor next to a tpu tensor, as torch does for cuda
SCALAR_OK = {
    "add_0d": lambda t, s: t + s,
    "radd_0d": lambda t, s: s - t,
    "mul_python": lambda t, s: 2.5 * t,
    "maximum_0d": lambda t, s: torch.maximum(t, s),
    "where_0d": lambda t, s: torch.where(t > 0, s, t),
    "where_cond_0d": lambda t, s: torch.where(s > 0, t, -t),
    "lerp_0d": lambda t, s: torch.lerp(t, t * 2, s),
    "addcmul_0d": lambda t, s: torch.addcmul(t, t, s),
    "add_0d_into_tpu": lambda t, s: t.clone().add_(s),
    "fill_0d": lambda t, s: t.clone().fill_(s),
    "int_0d_promotes": lambda t, s: t + s.long(),
    "f64_0d_keeps_f32": lambda t, s: t * s.double(),
}


@pytest.mark.parametrize("name", sorted(SCALAR_OK))
def test_cpu_scalars_and_zero_dim_cpu_tensors_are_allowed(name, eager_mode):
    fn = SCALAR_OK[name]
    x, s = torch.randn(2, 3), torch.tensor(0.75)
    expected = fn(x, s)
    with mode(eager_mode), no_fallback():
        actual = fn(x.to("tpu"), s)
        assert actual.device == torch.device("tpu", 0)
        torch.testing.assert_close(actual.cpu(), expected, check_dtype=True)


# -- 6. 64-bit values survive -------------------------------------------------------

WIDE = {
    "int64_sum": (lambda x: x.sum(), torch.tensor([2**40, 2**40, -(2**33)], dtype=I64)),
    "int64_mul": (lambda x: x * 3, torch.tensor([2**61, -(2**60)], dtype=I64)),
    "int64_cumsum": (lambda x: x.cumsum(0), torch.full((4,), 2**31 - 1, dtype=I64)),
    "int64_arange": (lambda x: torch.arange(2**33, 2**33 + 4, device=x.device) + x, torch.zeros(4, dtype=I64)),
    "int64_max": (lambda x: x.max(), torch.tensor([2**53 + 1, 2**53], dtype=I64)),
    "int64_from_float": (lambda x: x.long(), torch.tensor([2.0**40 + 3, -(2.0**45)], dtype=F64)),
    "float64_sum": (lambda x: x.sum(), torch.tensor([1.0, 1e-12, -1.0, 1e-300], dtype=F64)),
    "float64_mm": (lambda x: x @ x, torch.tensor([[1 + 1e-10, 1e-200], [3.0, 1e300]], dtype=F64)),
    "float64_exp": (lambda x: torch.exp(x), torch.tensor([700.0, -700.0], dtype=F64)),
}


@pytest.mark.parametrize("name", sorted(WIDE))
def test_int64_and_float64_values_survive(name, eager_mode):
    fn, x = WIDE[name]
    tol = dict(rtol=0, atol=0) if x.dtype is I64 or name.startswith("int64") else dict(rtol=1e-15, atol=0)
    with no_fallback():
        run_both(fn, x, mode_name=eager_mode, **tol)


# -- 8. torch.optim takes its foreach path on tpu by default --------------------------


@pytest.mark.parametrize(
    "name, make, module, multi_tensor",
    [
        ("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "torch.optim.sgd", "_multi_tensor_sgd"),
        ("adam", lambda p: torch.optim.Adam(p, lr=1e-2), "torch.optim.adam", "_multi_tensor_adam"),
    ],
)
def test_default_optimizers_take_the_foreach_path(name, make, module, multi_tensor, monkeypatch):
    module = importlib.import_module(module)
    calls = []
    original = getattr(module, multi_tensor)

    def counting(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, multi_tensor, counting)
    results = {}
    for device in ("cpu", "tpu"):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3).to(device)
        opt = make(model.parameters())
        calls.clear()
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(2, 4, device=device)).square().sum().backward()
            opt.step()
        results[device] = (len(calls), [p.detach().cpu() for p in model.parameters()])
    assert results["tpu"][0] == 3  # one multi-tensor (_foreach_*) update per step
    torch.testing.assert_close(results["tpu"][1], results["cpu"][1], rtol=1e-5, atol=1e-5)
