"""PyTorch's OpInfo ``op_db`` on ``tpu``, against CPU torch.

One *case* is an OpInfo entry, a dtype, a kind (``"forward"`` or ``"grad"``)
and an eager mode. ``run_case`` runs every sample input of the entry on CPU
and on ``tpu`` and returns what went wrong, or None; ``tests/test_opinfo.py``
turns cases into tests, ``lazytpu.tools.coverage`` into a coverage table.

Note [OpInfo comparison]: outputs are compared as torch's own
``test_compare_cpu`` does: ``output_process_fn_grad`` applied to both sides
(it makes non-unique results such as SVD's signs comparable), dtype and shape
checked exactly, values within a per-dtype tolerance (XLA reassociates and
uses other transcendental approximations). Entries whose ``test_compare_cpu``
torch skips (random ops, uninitialized memory) are compared by dtype and
shape only. In defer mode every sample is recorded before the first result
is read, so one case compiles one program, not one per sample.

Note [OpInfo slices]: a case runs at most ``max_samples`` of its entry's
samples, evenly spaced (a few entries have over a thousand, one compile
each in strict mode); ``cases`` lists the full run (every entry, every dtype
of ``DTYPES`` it supports, gradients in float32 and complex64, a fixed strict-mode sample)
or the default slice (every ``SLICE_EVERY``-th entry, float32 forward).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import attrs
import torch

from lazytpu import metrics, runtime

F32, F64, I64, I32, B, BF16, F16, C64 = (
    torch.float32,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.bool,
    torch.bfloat16,
    torch.float16,
    torch.complex64,
)
# The dtypes a full run covers, in this order (float32 first: the headline).
DTYPES = (F32, F64, I64, I32, B, BF16, F16, C64)

# One tolerance table for every entry (Note [OpInfo comparison]).
TOLERANCES = {
    F16: dict(rtol=1e-2, atol=1e-2),
    BF16: dict(rtol=1.6e-2, atol=1e-2),
    F32: dict(rtol=1e-4, atol=1e-4),
    F64: dict(rtol=1e-7, atol=1e-7),
    torch.complex64: dict(rtol=1e-4, atol=1e-4),
    torch.complex128: dict(rtol=1e-7, atol=1e-7),
}
# Gradients go through more arithmetic than outputs.
GRAD_TOLERANCES = {**TOLERANCES, F32: dict(rtol=1e-3, atol=1e-3), C64: dict(rtol=1e-3, atol=1e-3)}

# Entries whose algorithm differs from CPU torch's in a way that moves float32
# results past TOLERANCES (dtype -> tolerance), with the reason.
TOLERANCE_OVERRIDES = {
    # jax.scipy.linalg.expm scales and squares with another Pade degree than torch.
    "matrix_exp": {F32: dict(rtol=1e-3, atol=1e-3)},
}

# Entries whose outputs are random although torch's test_compare_cpu does not
# skip them (on CUDA its generators differ anyway): dtype and shape only.
RANDOM_ENTRIES = frozenset(
    {"randn", "randint", "rand", "randn_like", "rand_like", "randint_like", "normal.in_place"}
    | {"nn.functional.alpha_dropout"}
)
# Entries whose samples hold an argument tensor torch requires on CPU.
CPU_ARGUMENTS = frozenset({"tensor_split"})
# Samples per case, and the default slice's stride (Note [OpInfo slices]).
MAX_SAMPLES = {"forward": 32, "forward_other": 8, "grad": 8, "strict": 4}
SLICE_EVERY = 4
STRICT_EVERY = 10


def _op_db() -> list:
    from torch.testing._internal.common_methods_invocations import op_db

    return op_db


@functools.cache
def entries() -> tuple:
    """Every OpInfo entry of ``op_db``, in its order."""
    return tuple(_op_db())


def entry_id(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


@functools.cache
def entry(name: str):
    for op in entries():
        if entry_id(op) == name:
            return op
    raise KeyError(name)


def dtypes_of(op) -> tuple:
    """The dtypes of ``DTYPES`` the entry supports on CPU."""
    supported = op.supported_dtypes("cpu")
    return tuple(d for d in DTYPES if d in supported)


def grad_dtypes_of(op) -> tuple:
    if not op.supports_autograd:
        return ()
    supported = op.supported_backward_dtypes("cpu")
    return tuple(d for d in (F32, F64, C64) if d in supported)


def compares_values(op) -> bool:
    """False for entries torch's ``test_compare_cpu`` skips (random ops, empty memory)."""
    if entry_id(op) in RANDOM_ENTRIES:
        return False
    for info in op.decorators:
        if getattr(info, "test_name", None) != "test_compare_cpu" or info.device_type not in (None, "cpu"):
            continue
        for deco in info.decorators:
            if "skip" in getattr(deco, "__qualname__", ""):
                return False
    return True


@attrs.frozen
class Failure:
    """Why a case failed: a short ``kind`` (``mismatch``, ``error``,
    ``fallback``, ``grad``), a message, and the ops that fell back."""

    kind: str
    message: str
    fallbacks: tuple = ()

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


# -- moving samples ------------------------------------------------------------


def _to_tpu(t):
    if isinstance(t, torch.Tensor):
        out = t.detach().to("tpu")
        return out.requires_grad_(t.requires_grad) if t.requires_grad else out
    return t


def _is_cpu(v) -> bool:
    return (isinstance(v, str) and v == "cpu") or (isinstance(v, torch.device) and v.type == "cpu")


def _sample_on_tpu(sample, keep_args: bool = False):
    """The sample with its tensors on ``tpu``; a ``"cpu"`` device argument
    (the device the samples were made for) becomes ``"tpu"``."""
    moved = sample.transform(_to_tpu)
    moved.args = sample.args if keep_args else tuple("tpu" if _is_cpu(a) else a for a in moved.args)
    moved.kwargs = {k: ("tpu" if k == "device" and _is_cpu(v) else v) for k, v in moved.kwargs.items()}
    return moved


def _clone_sample(sample):
    """A fresh CPU copy (ops may write into their inputs)."""

    def clone(t):
        if isinstance(t, torch.Tensor):
            return t.detach().clone().requires_grad_(t.requires_grad)
        return t

    copy = sample.transform(clone)
    return copy


def _cpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu(y) for y in x)
    return x


def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, dict):
        return [t for y in x.values() for t in _tensors(y)]
    return []


def _sample_tensors(sample) -> list:
    return _tensors(sample.input) + _tensors(list(sample.args)) + _tensors(sample.kwargs)


# -- comparing -----------------------------------------------------------------


def compare(actual, expected, *, values: bool = True, tolerances=None, where: str = "output") -> str | None:
    """None when ``actual`` (on CPU) matches ``expected``; else what differs."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return f"{where}: expected a tensor, got {type(actual).__name__}"
        if actual.dtype != expected.dtype:
            return f"{where}: dtype {actual.dtype}, expected {expected.dtype}"
        if actual.shape != expected.shape:
            return f"{where}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        if not values:
            return None
        tol = (tolerances or TOLERANCES).get(expected.dtype, dict(rtol=0, atol=0))
        try:
            torch.testing.assert_close(actual, expected, equal_nan=True, check_device=False, **tol)
        except AssertionError as exc:
            return f"{where}: {' '.join(str(exc).split())[:300]}"
        return None
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return f"{where}: expected a sequence of {len(expected)}, got {type(actual).__name__}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            msg = compare(a, e, values=values, tolerances=tolerances, where=f"{where}[{i}]")
            if msg:
                return msg
        return None
    if values and not (actual == expected or (actual != actual and expected != expected)):
        return f"{where}: {actual!r}, expected {expected!r}"
    return None


# -- running -------------------------------------------------------------------


@contextlib.contextmanager
def _eager_mode(name: str) -> Iterator[None]:
    with torch.tpu.set_eager_mode(name):
        yield


def samples_of(op, dtype, *, grad: bool, max_samples: int | None = None) -> list:
    """The entry's sample inputs (CPU), seeded so every run sees the same;
    at most ``max_samples``, evenly spaced (Note [OpInfo slices])."""
    torch.manual_seed(0)
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=grad))
    if grad:
        samples = [s for s in samples if any(t.requires_grad for t in _sample_tensors(s))]
    if max_samples is not None and len(samples) > max_samples:
        step = len(samples) / max_samples
        samples = [samples[int(i * step)] for i in range(max_samples)]
    return samples


def _call(op, sample):
    return op(sample.input, *sample.args, **sample.kwargs)


def _fallbacks_since(before) -> tuple:
    after = metrics.snapshot()["cpu_fallbacks"]
    return tuple(sorted(k for k in after if after[k] > before.get(k, 0)))


def _grad_outputs(out) -> list:
    return [t for t in _tensors(out) if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def run_case(op, dtype, kind: str = "forward", mode: str = "defer", max_samples: int | None = None) -> Failure | None:
    """Run every sample of ``op`` in ``dtype`` on CPU and on ``tpu``.

    Args:
        op: an OpInfo entry.
        dtype: the samples' dtype.
        kind: ``"forward"`` compares outputs (and inputs written in place);
            ``"grad"`` compares the gradients of the inputs for a random
            cotangent of the outputs.
        mode: the eager mode on ``tpu`` (``"defer"`` or ``"strict"``).
        max_samples: run at most this many samples (Note [OpInfo slices]).

    Returns:
        None when everything matches and nothing fell back to CPU.
    """
    grad = kind == "grad"
    samples = samples_of(op, dtype, grad=grad, max_samples=max_samples)
    if not samples:
        return None
    values = compares_values(op)
    keep_args = entry_id(op) in CPU_ARGUMENTS
    expected, actual, cpu_inputs, tpu_inputs = [], [], [], []
    before = dict(metrics.snapshot()["cpu_fallbacks"])
    with _eager_mode(mode), torch.autograd.set_grad_enabled(grad):
        for sample in samples:
            cpu_sample = _clone_sample(sample)
            try:
                want = _call(op, cpu_sample)
            except Exception:  # noqa: BLE001 - a sample CPU torch rejects is not a test
                continue
            tpu_sample = _sample_on_tpu(sample, keep_args)
            try:
                got = _call(op, tpu_sample)
            except Exception as exc:  # noqa: BLE001 - reported as the case's failure
                return Failure("error", f"{type(exc).__name__}: {_short(exc)}", _fallbacks_since(before))
            expected.append((sample.output_process_fn_grad(want), _sample_tensors(cpu_sample)))
            actual.append((sample.output_process_fn_grad(got), _sample_tensors(tpu_sample)))
            cpu_inputs.append(cpu_sample)
            tpu_inputs.append(tpu_sample)
        if grad:
            return _compare_grads(expected, actual, values, before)
        try:
            got_cpu = [(_cpu(out), _cpu(ins)) for out, ins in actual]
        except Exception as exc:  # noqa: BLE001 - a deferred failure surfaces when read
            return Failure("error", f"{type(exc).__name__}: {_short(exc)}", _fallbacks_since(before))
    fallbacks = _fallbacks_since(before)
    for i, ((got_out, got_in), (want_out, want_in)) in enumerate(zip(got_cpu, expected)):
        tol = {**TOLERANCES, **TOLERANCE_OVERRIDES.get(entry_id(op), {})}
        msg = compare(got_out, want_out, values=values, tolerances=tol, where=f"sample {i} output")
        msg = msg or compare(got_in, want_in, values=values, tolerances=tol, where=f"sample {i} input (in place)")
        if msg:
            return Failure("mismatch", msg, fallbacks)
    if fallbacks:
        return Failure("fallback", "CPU fallback: " + ", ".join(fallbacks), fallbacks)
    return None


def _compare_grads(expected, actual, values, before) -> Failure | None:
    gen = torch.Generator().manual_seed(0)
    for i, ((want, want_in), (got, got_in)) in enumerate(zip(expected, actual)):
        want_outs = _grad_outputs(want)
        if not want_outs:
            continue
        got_outs = _grad_outputs(got)
        if len(got_outs) != len(want_outs):
            return Failure("grad", f"sample {i}: {len(got_outs)} differentiable outputs, expected {len(want_outs)}")
        leaves = [j for j, t in enumerate(want_in) if t.requires_grad]
        cotangents = [torch.randn(t.shape, generator=gen, dtype=t.dtype) for t in want_outs]
        try:
            want_grads = torch.autograd.grad(want_outs, [want_in[j] for j in leaves], cotangents, allow_unused=True)
        except Exception:  # noqa: BLE001 - not differentiable on CPU either (e.g. geqrf)
            continue
        try:
            tpu_cotangents = [c.to(o.device) for c, o in zip(cotangents, got_outs)]
            got_grads = torch.autograd.grad(got_outs, [got_in[j] for j in leaves], tpu_cotangents, allow_unused=True)
            got_grads = [_cpu(g) for g in got_grads]
        except Exception as exc:  # noqa: BLE001 - reported as the case's failure
            return Failure("error", f"backward: {type(exc).__name__}: {_short(exc)}", _fallbacks_since(before))
        for j, (g, w) in enumerate(zip(got_grads, want_grads)):
            if (g is None) != (w is None):
                return Failure("grad", f"sample {i} input {j}: gradient {g is not None}, expected {w is not None}")
            if w is not None:
                msg = compare(g, w, values=values, tolerances=GRAD_TOLERANCES, where=f"sample {i} grad {j}")
                if msg:
                    return Failure("grad", msg, _fallbacks_since(before))
    fallbacks = _fallbacks_since(before)
    if fallbacks:
        return Failure("fallback", "CPU fallback: " + ", ".join(fallbacks), fallbacks)
    return None


def _short(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


# -- which ops a case touches --------------------------------------------------


@contextlib.contextmanager
def traced_ops() -> Iterator[set]:
    """The set of ops that reach lazytpu's dispatcher inside the block
    (filled as they arrive; the dispatcher is restored on exit)."""
    from lazytpu.frontend import tensor

    seen: set = set()
    dispatch = tensor.BACKEND.dispatch

    def tracing(func, args, kwargs):
        seen.add(func)
        return dispatch(func, args, kwargs)

    previous = tensor.install(dispatch=tracing)
    try:
        yield seen
    finally:
        tensor.install(**previous)


# -- cases ---------------------------------------------------------------------


@attrs.frozen
class Case:
    """One test: an entry, a dtype, ``"forward"`` or ``"grad"``, a mode."""

    entry: str
    dtype: torch.dtype
    kind: str = "forward"
    mode: str = "defer"
    max_samples: int | None = None

    @property
    def id(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{self.entry}-{dtype}-{self.kind}" + ("-strict" if self.mode == "strict" else "")

    def run(self) -> Failure | None:
        try:
            return run_case(entry(self.entry), self.dtype, self.kind, self.mode, self.max_samples)
        finally:
            # Note [Bounded caches]: thousands of cases compile thousands of
            # programs; each XLA:CPU executable holds memory mappings, and a
            # process has at most vm.max_map_count (65530) of them.
            runtime.clear_caches()


def cases(full: bool) -> list[Case]:
    """The full run or the default slice (Note [OpInfo slices])."""
    out = []
    for i, op in enumerate(entries()):
        name, dtypes = entry_id(op), dtypes_of(op)
        if not full:
            if i % SLICE_EVERY == 0 and F32 in dtypes:
                out.append(Case(name, F32, max_samples=MAX_SAMPLES["forward"]))
            continue
        for dtype in dtypes:
            cap = MAX_SAMPLES["forward" if dtype == F32 else "forward_other"]
            out.append(Case(name, dtype, max_samples=cap))
        grads = grad_dtypes_of(op)
        for dtype in (d for d in (F32, C64) if d in grads):
            out.append(Case(name, dtype, "grad", max_samples=MAX_SAMPLES["grad"]))
        if i % STRICT_EVERY == 0 and F32 in dtypes:
            out.append(Case(name, F32, mode="strict", max_samples=MAX_SAMPLES["strict"]))
    return out
