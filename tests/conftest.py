"""Shared test helpers: run the same function on CPU torch and on ``tpu``."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile

# A private compile cache per test session (tests must not depend on what an
# earlier run left on disk); set before lazytpu reads its flags. Each pytest-xdist
# worker inherits the session's and takes a directory of its own in it: tests
# count the entries on disk. The process that made it removes it at exit.
if "LAZYTPU_CACHE_DIR" not in os.environ:
    os.environ["LAZYTPU_CACHE_DIR"] = tempfile.mkdtemp(prefix="lazytpu-test-cache-")
    atexit.register(shutil.rmtree, os.environ["LAZYTPU_CACHE_DIR"], ignore_errors=True)
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["LAZYTPU_CACHE_DIR"] = os.path.join(os.environ["LAZYTPU_CACHE_DIR"], os.environ["PYTEST_XDIST_WORKER"])

import hypothesis
import pytest
import torch

import lazytpu

hypothesis.settings.register_profile(
    "ci",
    max_examples=25,
    deadline=None,
    derandomize=True,
    suppress_health_check=[hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.data_too_large],
)
hypothesis.settings.load_profile("ci")

MODES = ("defer", "strict")
# A defer step's backward and optimizer update are programs of their own (Note [Step segments]
# in lazytpu/engine.py) unless LAZYTPU_STEP_SEGMENTS=0: the programs a plain step runs.
STEP_PROGRAMS = 3 if lazytpu._config.STEP_SEGMENTS.get() else 1

# Note [Tolerances]: one per-dtype tolerance table: XLA:CPU may fuse and
# reassociate, so float results differ from CPU torch by a few ulps.
TOLERANCES = {
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
    torch.float32: dict(rtol=1.3e-5, atol=1e-5),
    torch.float64: dict(rtol=1e-7, atol=1e-7),
    torch.complex64: dict(rtol=1.3e-5, atol=1e-5),
}


def tolerance(dtype: torch.dtype) -> dict:
    return TOLERANCES.get(dtype, dict(rtol=0, atol=0))


def to_tpu(x):
    if isinstance(x, torch.Tensor):
        t = x.detach().to("tpu")
        return t.requires_grad_(x.requires_grad) if x.is_floating_point() or x.is_complex() else t
    if isinstance(x, (list, tuple)):
        return type(x)(to_tpu(y) for y in x)
    return x


def to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(to_cpu(y) for y in x)
    return x


def assert_close(actual, expected, **tol):
    """Compare (nested) results with dtype and device-independent values."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual)}"
        assert actual.device.type == "cpu"
        kw = tol or tolerance(expected.dtype)
        torch.testing.assert_close(actual, expected, check_dtype=True, equal_nan=True, **kw)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_close(a, e, **tol)
    else:
        assert actual == expected or (actual != actual and expected != expected), (actual, expected)


@contextlib.contextmanager
def mode(name: str):
    with torch.tpu.set_eager_mode(name):
        yield


def run_both(fn, *inputs, mode_name: str = "defer", grad: bool = False, **tol):
    """Run ``fn`` on CPU and on ``tpu`` (in ``mode_name``) and compare.

    With ``grad=True`` the sum of the (float) outputs is back-propagated and
    the inputs' gradients are compared too.
    """
    cpu_inputs = [
        x.detach().clone().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in inputs
    ]
    expected = fn(*cpu_inputs)
    with mode(mode_name):
        tpu_inputs = [to_tpu(x) for x in inputs]
        actual = fn(*tpu_inputs)
        assert_close(to_cpu(actual), to_cpu(expected), **tol)
        if grad:

            def total(out):
                outs = out if isinstance(out, (list, tuple)) else [out]
                return sum(o.float().sum() for o in outs if isinstance(o, torch.Tensor) and o.requires_grad)

            total(expected).backward()
            total(actual).backward()
            for c, t in zip(cpu_inputs, tpu_inputs):
                if isinstance(c, torch.Tensor) and c.requires_grad:
                    assert t.grad is not None, "no gradient on tpu"
                    assert_close(t.grad.cpu(), c.grad, **tol)
    return actual


@contextlib.contextmanager
def no_fallback():
    """Fail if anything inside the block falls back to CPU."""
    before = dict(lazytpu.metrics.snapshot()["cpu_fallbacks"])
    yield
    after = lazytpu.metrics.snapshot()["cpu_fallbacks"]
    assert after == before, f"CPU fallback: {set(after) - set(before)}"


def programs_run(fn) -> int:
    """How many programs ``fn`` executed."""
    lazytpu.sync()
    before = lazytpu.metrics.snapshot()["programs_executed"]
    fn()
    return lazytpu.metrics.snapshot()["programs_executed"] - before


@pytest.fixture
def fresh_dynamo():
    """dynamo's caches, lazytpu's compiled graphs and the metrics cleared around a test."""
    import torch._dynamo

    torch._dynamo.reset()
    lazytpu.compile.clear()
    lazytpu.metrics.reset()
    yield
    torch._dynamo.reset()


def programs_compiled(fn, *args) -> tuple:
    """(how many programs ``fn(*args)`` compiled, its result), synced before and after."""
    lazytpu.sync()
    before = lazytpu.metrics.snapshot()["programs_compiled"]
    out = fn(*args)
    lazytpu.sync()
    return lazytpu.metrics.snapshot()["programs_compiled"] - before, out


@pytest.fixture(params=MODES)
def eager_mode(request):
    """Parametrize a test over defer and strict mode."""
    return request.param


@pytest.fixture(autouse=True)
def _no_failed_check_left_behind():
    """A value check that failed is raised at the next host read (Note [Value checks]): a test must not
    leave one for the next test to trip over (its bad op would compute a wrong value unnoticed)."""
    yield
    try:
        torch.tpu.synchronize()  # runs and reads what the test left pending
    except Exception as exc:  # noqa: BLE001 - reported as the test's own error
        pytest.fail(f"the test left a failed value check for the next host read: {type(exc).__name__}: {exc}")
