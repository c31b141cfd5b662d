"""Dtype-support parity: ops that CPU torch rejects for a dtype, does ``tpu`` reject them too?

    python tests/dtype_sweep.py        (make dtype-sweep)

For every OpInfo entry that supports float32 on CPU, the first float32
sample is cast to each dtype the entry does *not* support on CPU and run on
CPU torch and on ``tpu``. A line is printed for each case where CPU torch
raises at the call and ``tpu`` computes a result (a missing error: lazytpu's
lowering accepts what torch's kernel rejects) or raises only when the result
is computed (its lowering's error, not torch's), then the count. Not part of the test
suite: a survey for the next fix (Note [Kernel checks] in lazytpu/frontend/checks/kernel_checks.py).
"""

from __future__ import annotations

import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

import lazytpu  # noqa: F401  (registers the tpu device)

DTYPES = (
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.uint16,  # CPU computes few ops in these (Note [Complex kernel checks])
    torch.uint32,
    torch.uint64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)


def _map(x, fn):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, list | tuple):
        return type(x)(_map(a, fn) for a in x)
    if isinstance(x, dict):
        return {k: _map(a, fn) for k, a in x.items()}
    return x


def _error(call) -> str | None:
    """The error ``call`` raises (a tpu call's at the call, or later: ``late: ...``), or None."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - any error counts as rejecting the dtype
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
    try:
        torch.tpu.synchronize()
    except Exception as exc:  # noqa: BLE001 - an error of the computation, not of the call
        return f"late: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
    return None


def missing_errors():
    """Yield ``(op name, variant, dtype, CPU's error)`` for each case tpu accepts."""
    for op in op_db:
        try:
            supported = op.supported_dtypes("cpu")
            samples = list(op.sample_inputs("cpu", torch.float32)) if torch.float32 in supported else []
        except Exception:  # noqa: BLE001 - entries that cannot make samples here
            continue
        if not samples:
            continue
        sample = samples[0]
        for dtype in (d for d in DTYPES if d not in supported):

            def cast(t, dtype=dtype):
                return t.to(dtype) if t.is_floating_point() else t

            inp, args = _map(sample.input, cast), _map(sample.args, cast)
            cpu = _error(lambda: op(inp, *args, **sample.kwargs))  # noqa: B023
            if cpu is None or cpu.startswith("late"):
                continue
            try:
                on_tpu = _map((inp, args, sample.kwargs), lambda t: t.to("tpu"))  # kwargs too: a weight, a mask
            except NotImplementedError:  # a sparse sample: tpu tensors are strided
                continue
            tpu = _error(lambda: op(on_tpu[0], *on_tpu[1], **on_tpu[2]))  # noqa: B023
            if tpu is None or tpu.startswith("late"):
                yield op.name, op.variant_test_name, dtype, cpu if tpu is None else f"{cpu}; tpu: {tpu}"


def main() -> int:
    warnings.simplefilter("ignore")
    count = 0
    for name, variant, dtype, cpu in missing_errors():
        count += 1
        print(f"{name}{'.' + variant if variant else ''} {str(dtype).removeprefix('torch.')}: CPU raises {cpu}")
    print(f"{count} cases where CPU torch raises at the call and tpu computes (or fails computing)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
