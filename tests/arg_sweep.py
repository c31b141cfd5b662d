"""Argument-check parity: calls that CPU torch rejects without reading data, does ``tpu`` reject them too?

    python tests/arg_sweep.py [NAME ...]      (make arg-sweep)

For every OpInfo entry (its float32 samples, or those of its first
supported dtype) two kinds of bad argument are made, one at a time:

- each int ``dim``-like argument (keyword ``dim``/``dims``/``axis``/...,
  or a positional int the op's schema names ``dim``/``dim0``/``start_dim``/...)
  set to an out-of-range value: ``ndim``, ``ndim + 1``, ``ndim + 2``,
  ``-ndim - 1`` and ``-ndim - 2`` (of the sample's first tensor; one
  element of a list of dims at a time);
- each integer tensor argument (an index, a target, lengths) cast to
  float32, int32, int16, uint8 and bool.

Each call runs on CPU torch and, where CPU raises, on ``tpu`` (defer mode;
results are read with ``.cpu()`` so deferred work runs). A line is printed
for each case where CPU raises and ``tpu`` computes (a missing check: see
Note [Kernel checks] in lazytpu/frontend/checks/kernel_checks.py), then each case where
both raise with a different exception type, and each where the messages
differ, then the counts and the runtime. Each bad argument is tried on the
first sample of each input rank that CPU rejects with it. Not part of the
test suite: a survey for the next fix; names on the command line restrict
it to those op_db entries. With ndim = 0, the out-of-range values are those
of ndim = 1 (a scalar takes dims -1 and 0).
"""

from __future__ import annotations

import time

_START = time.perf_counter()

import collections  # noqa: E402
import inspect  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

import torch  # noqa: E402
from dtype_sweep import _map  # noqa: E402  (tests/ is the script's directory)
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402

import lazytpu  # noqa: E402,F401  (registers the tpu device)

# Schema names of arguments that are dimensions of the input.
DIM_NAMES = frozenset(
    {
        "dim",
        "dims",
        "axis",
        "axes",
        "dim0",
        "dim1",
        "dim2",
        "axis0",
        "axis1",
        "start_dim",
        "end_dim",
        "source",
        "destination",
        "dimension",
        "dims_self",
        "dims_other",
    }
)
INDEX_DTYPES = (torch.float32, torch.int32, torch.int16, torch.uint8, torch.bool)
_INT_TYPES = frozenset({"int", "int[]", "Optional[int]", "List[int]", "Optional[List[int]]", "int[1]", "int[2]"})


def _read(out):
    """Host copies of every tensor in ``out`` (runs the deferred work)."""
    return _map(out, lambda t: t.cpu())


def _outcome(call) -> tuple[str, str] | None:
    try:
        _read(call())
        torch.tpu.synchronize()
    except Exception as exc:  # noqa: BLE001 - any error counts as rejecting the call
        return type(exc).__name__, str(exc)
    return None


def _is_dim_type(arg) -> bool:
    return str(arg.type).replace(" ", "") in _INT_TYPES


def _positional_dim_slots(op) -> frozenset:
    """Positions (0 = the first argument after the input) that the op's
    Python signature, or one of its aten schemas, names as a dimension."""
    slots = set()
    try:
        params = list(inspect.signature(op.op).parameters.values())
    except (TypeError, ValueError):
        params = None
    if params:
        for i, p in enumerate(params[1:]):
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name in DIM_NAMES:
                slots.add(i)
    for name in {op.aten_name, op.name.split(".")[-1]}:
        for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}"):
            for i, arg in enumerate(schema.arguments[1:]):
                if not arg.kwarg_only and arg.name in DIM_NAMES and _is_dim_type(arg):
                    slots.add(i)
    return frozenset(slots)


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, list | tuple):
        for a in x:
            t = _first_tensor(a)
            if t is not None:
                return t
    return None


def _bad_dims(value, ndim: int):
    """Out-of-range variants of a dim argument (an int or a list of ints)."""
    n = max(ndim, 1)
    bad = (n, n + 1, n + 2, -n - 1, -n - 2)  # n + 1 and -n - 1 are in range for unsqueeze and stack
    if type(value) is int:
        yield from bad
    elif isinstance(value, list | tuple) and value and all(type(v) is int for v in value):
        for i in range(len(value)):
            for b in bad:
                yield type(value)((*value[:i], b, *value[i + 1 :]))


def _mutations(op, sample):
    """``(label, input, args, kwargs)`` for each bad variant of ``sample``."""
    first = _first_tensor(sample.input)
    ndim = first.dim() if first is not None else 0
    slots = _positional_dim_slots(op)
    args, kwargs = list(sample.args), dict(sample.kwargs)
    for i, a in enumerate(args):
        if i in slots:
            for bad in _bad_dims(a, ndim):
                yield f"arg{i}={bad}", sample.input, (*args[:i], bad, *args[i + 1 :]), kwargs
    for k, a in kwargs.items():
        if k in DIM_NAMES:
            for bad in _bad_dims(a, ndim):
                yield f"{k}={bad}", sample.input, args, {**kwargs, k: bad}
    # integer tensors: indices, targets, lengths (one at a time, in the input
    # too, and in a list such as index_put's indices)
    call = (sample.input, tuple(args), kwargs)
    for path, t in _integer_tensors(call):
        for dtype in INDEX_DTYPES:
            if dtype != t.dtype:
                label = f"{'.'.join(map(str, path))}:{str(dtype).removeprefix('torch.')}"
                yield (label, *_replaced(call, path, t.to(dtype)))


def _integer_tensors(call):
    """``(path, tensor)`` of the int64/int32 tensors of ``(input, args,
    kwargs)``, at most one list deep; a path names the places on the way
    (``input``, ``arg<i>``, ``kwarg<name>``, then an element's position)."""
    inp, args, kwargs = call
    tops = [(("input",), inp)] + [((f"arg{i}",), a) for i, a in enumerate(args)]
    tops += [((f"kwarg{k}",), a) for k, a in kwargs.items()]
    for path, x in tops:
        inner = list(enumerate(x)) if isinstance(x, list | tuple) else [(None, x)]
        for i, t in inner:
            if isinstance(t, torch.Tensor) and t.dtype in (torch.int64, torch.int32):
                yield (path if i is None else (*path, i)), t


def _replaced(call, path, value):
    """``call`` with the tensor at ``path`` replaced by ``value``."""
    inp, args, kwargs = call
    head, *rest = path

    def put(x):
        if not rest:
            return value
        return type(x)((value if j == rest[0] else a) for j, a in enumerate(x))

    if head == "input":
        return put(inp), args, kwargs
    if head.startswith("arg"):
        i = int(head[3:])
        return inp, (*args[:i], put(args[i]), *args[i + 1 :]), kwargs
    k = head[5:]
    return inp, args, {**kwargs, k: put(kwargs[k])}


def _samples(op):
    try:
        supported = op.supported_dtypes("cpu")
        dtype = torch.float32 if torch.float32 in supported else next(iter(sorted(supported, key=str)), None)
        return [] if dtype is None else list(op.sample_inputs("cpu", dtype))
    except Exception:  # noqa: BLE001 - entries that cannot make samples here
        return []


def _on_tpu(op, inp, args, kwargs):
    """tpu's outcome with every tensor moved there (kwargs too: a weight, a
    mask), or with the input alone moved where an argument must stay on the
    CPU (``tensor_split``'s indices)."""
    on_tpu = _map((inp, args, kwargs), lambda t: t.to("tpu"))
    tpu = _outcome(lambda: op(on_tpu[0], *on_tpu[1], **on_tpu[2]))
    if tpu is not None and "to be on cpu" in tpu[1]:
        tpu = _outcome(lambda: op(_map(inp, lambda t: t.to("tpu")), *args, **kwargs))
    return tpu


def _line(message: str) -> str:
    return message.splitlines()[0][:110] if message else ""


def _tpu_as_cpu(message: str) -> str:
    return re.sub(r"(?<![a-z])tpu(:0)?(?![a-z])", "cpu", message)


def sweep(names=(), tried: collections.Counter | None = None):
    """Yield ``(kind, case, CPU's outcome, tpu's outcome)`` for each case that
    differs: kind is ``missing`` (CPU raises, tpu computes), ``type`` (both
    raise, different exception types) or ``message`` (the same type, another
    message). ``tried`` counts the bad calls CPU rejects, per op_db name."""
    tried = collections.Counter() if tried is None else tried
    for op in op_db:
        if names and op.name not in names:
            continue
        seen = set()
        for sample in _samples(op):
            first = _first_tensor(sample.input)
            rank = first.dim() if first is not None else None
            for label, inp, args, kwargs in _mutations(op, sample):
                what = (label, rank)
                if what in seen:
                    continue
                cpu = _outcome(lambda: op(inp, *args, **kwargs))  # noqa: B023
                if cpu is None:
                    continue
                seen.add(what)
                tried[op.name] += 1
                tpu = _on_tpu(op, inp, args, kwargs)
                name = f"{op.name}{'.' + op.variant_test_name if op.variant_test_name else ''}"
                case = f"{name} ndim={rank} {label}"
                if tpu is None:
                    yield "missing", case, cpu, tpu
                elif tpu[0] != cpu[0]:
                    yield "type", case, cpu, tpu
                elif _tpu_as_cpu(tpu[1]) != cpu[1]:
                    yield "message", case, cpu, tpu


def main(argv) -> int:
    warnings.simplefilter("ignore")
    found = {"missing": [], "type": [], "message": []}
    tried = collections.Counter()
    for kind, case, cpu, tpu in sweep(frozenset(argv), tried):
        found[kind].append((case, cpu, tpu))
        if kind == "missing":
            print(f"{case}: CPU raises {cpu[0]}: {_line(cpu[1])}", flush=True)
    for case, cpu, tpu in found["type"]:
        print(f"{case}: CPU raises {cpu[0]}, tpu {tpu[0]}: {_line(tpu[1])}")
    print(f"{tried.total()} bad calls that CPU torch rejects, over {len(tried)} op_db names")
    print(f"{len(found['missing'])} cases where CPU torch raises and tpu computes")
    for case, cpu, tpu in found["message"]:
        print(f"{case}: CPU raises {cpu[0]}: {_line(cpu[1])}; tpu: {_line(tpu[1])}")
    print(f"{len(found['type'])} cases where both raise with different exception types")
    print(f"{len(found['message'])} cases where both raise the same type with different messages")
    print(f"{time.perf_counter() - _START:.0f}s (imports included)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
