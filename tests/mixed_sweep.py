"""Mixed-dtype parity: ops given floating operands of two dtypes, does ``tpu`` compute or refuse them as CPU torch?

    python tests/mixed_sweep.py [--complex] [NAME ...]        (make mixed-sweep)

For every OpInfo entry that supports float32 on CPU, each of its first three
float32 samples with two or more floating tensors is run five ways: the
other tensors in float64, bfloat16, float16 or int64, and the first in
float64 (``--complex``: complex64 samples with two complex tensors, the
others in complex128 or float32, the first in complex128). A line is
printed for each case where ``tpu`` raises where CPU torch computes, gives
another dtype or shape, or other values (beyond bfloat16's or float32's
rounding), or computes where CPU raises (or raises another error type), then
the count. Expected differences: random ops (``normal``...)
print value lines. Samples with sparse tensors are skipped (they stay on
CPU). Not part of the test suite: a survey for the next fix
(tests/test_mixed_dtypes.py holds the fixed cases, test_error_parity.py the
refused ones).
"""

from __future__ import annotations

import sys
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

import lazytpu  # noqa: F401  (registers the tpu device)

# Per sample dtype: (case, the first tensor's dtype, the other tensors' dtype), None where it stays.
VARIANTS = {
    torch.float32: (
        ("others_float64", None, torch.float64),
        ("others_bfloat16", None, torch.bfloat16),
        ("first_float64", torch.float64, None),
        ("others_int64", None, torch.int64),  # their values truncated
        ("others_float16", None, torch.float16),
    ),
    torch.complex64: (
        ("others_complex128", None, torch.complex128),
        ("first_complex128", torch.complex128, None),
        ("others_float32", None, torch.float32),  # their real parts
    ),
}


def _kind(dtype):
    return torch.Tensor.is_complex if dtype.is_complex else torch.Tensor.is_floating_point


def _mixed(sample, kind, first_dtype, other_dtype):
    """``sample`` with its first ``kind`` tensor in ``first_dtype``, the others in ``other_dtype``."""
    seen = []

    def cast(t):
        if not (isinstance(t, torch.Tensor) and kind(t)):
            return t
        dtype = other_dtype if seen else first_dtype
        seen.append(t)
        return t if dtype is None else (t.real if t.is_complex() and not dtype.is_complex else t).to(dtype)

    return sample.transform(cast)


def _run(op, sample, device):
    s = sample.transform(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t)
    out = op(s.input, *s.args, **s.kwargs)
    return [t.cpu() for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _difference(expected, actual) -> str | None:
    if len(expected) != len(actual):
        return f"{len(actual)} outputs, CPU {len(expected)}"
    for e, a in zip(expected, actual):
        if (e.dtype, e.shape) != (a.dtype, a.shape):
            return f"{a.dtype}{tuple(a.shape)}, CPU {e.dtype}{tuple(e.shape)}"
        if e.is_floating_point() or e.is_complex():
            tol = 2e-2 if e.dtype in (torch.bfloat16, torch.float16) else 1e-3
            if not torch.allclose(e.to(torch.complex128), a.to(torch.complex128), rtol=tol, atol=tol, equal_nan=True):
                return f"values differ by up to {(e.to(torch.complex128) - a.to(torch.complex128)).abs().max():.3g}"
    return None


def _first_line(exc) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:120]}"


def _compare(op, mixed) -> str | None:
    """What differs on tpu: values where CPU computes, a computed value or another error type where it raises."""
    try:
        expected = _run(op, mixed, "cpu")
    except Exception as exc:  # noqa: BLE001 - CPU rejects the mix: tpu must too
        refused = exc
    else:
        refused = None
    try:
        actual = _run(op, mixed, "tpu")
    except Exception as exc:  # noqa: BLE001 - an error where CPU computes, or another one
        if refused is None or type(refused) is not type(exc):
            return f"{_first_line(exc)}; CPU {_first_line(refused) if refused else 'computes'}"
        return None
    if refused is not None:
        return f"computes; CPU raises {_first_line(refused)}"
    return _difference(expected, actual)


def differences(names=(), dtype=torch.float32):
    """Yield ``(op name, variant, sample index, case, what differs)`` for samples of ``dtype``."""
    kind = _kind(dtype)
    for op in op_db:
        if names and op.name not in names:
            continue
        try:
            samples = list(op.sample_inputs("cpu", dtype))[:3] if dtype in op.supported_dtypes("cpu") else []
        except Exception:  # noqa: BLE001 - entries that cannot make samples here
            continue
        for index, sample in enumerate(samples):
            leaves = torch.utils._pytree.tree_leaves([sample.input, sample.args, sample.kwargs])
            if any(isinstance(t, torch.Tensor) and t.layout != torch.strided for t in leaves):
                continue  # sparse tensors stay on CPU (documented)
            if sum(1 for t in leaves if isinstance(t, torch.Tensor) and kind(t)) < 2:
                continue
            for case, first_dtype, other_dtype in VARIANTS[dtype]:
                found = _compare(op, _mixed(sample, kind, first_dtype, other_dtype))
                if found:
                    yield op.name, op.variant_test_name, index, case, found


def main() -> int:
    warnings.simplefilter("ignore")
    count = 0
    names = [a for a in sys.argv[1:] if a != "--complex"]
    dtype = torch.complex64 if "--complex" in sys.argv else torch.float32
    for name, variant, index, case, found in differences(set(names), dtype):
        print(f"{name}{'.' + variant if variant else ''} sample {index} {case}: {found}", flush=True)
        count += 1
    print(f"{count} differences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
