"""Lower a fused ``Program`` to one pure JAX function."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from jax._src.lax.lax import _convert_element_type

from lazytpu import _dtypes
from lazytpu.fusion.specialize import Constant
from lazytpu.ir.foreach_node import ForeachOp
from lazytpu.ir.template import fill
from lazytpu.lowering.casts import convert
from lazytpu.lowering.registry import get_rule


class LoweringError(RuntimeError):
    """A rule failed while tracing; names the op and where it was recorded.

    ``op_index`` is the failing op's position in the program, when known
    (Note [Failure isolation] in lazytpu.fusion.program)."""

    def __init__(self, message: str, op_index: int | None = None) -> None:
        super().__init__(message)
        self.op_index = op_index


def cast_to(x, aval):
    """Cast a rule's result to the dtype torch's meta kernel inferred."""
    target = _dtypes.to_jax(aval.dtype)
    x = jnp.asarray(x)
    if x.dtype != target:
        x = convert(x, target)
    if aval.dtype is torch.complex32:
        x = _dtypes.round_complex32(x)
    if x.shape != aval.shape:
        if 0 in aval.shape:  # empty: its shape says all (a rule may give another shape for empty inputs)
            return jnp.zeros(aval.shape, target)
        x = jnp.broadcast_to(x, aval.shape)
    return x


def apply_op(op, spec, in_values: list, out_avals) -> tuple:
    """Run one op's rule on JAX values; returns its outputs, cast."""
    if type(op) is ForeachOp:
        return _apply_foreach(op, spec, in_values, out_avals)
    rule = get_rule(op)
    args, kwargs = fill(spec, in_values)
    default = kwargs.pop(_dtypes.DEFAULT_KWARG, None) if kwargs else None
    if default is not None:  # Note [Default dtype in programs]
        with _dtypes.lowering_default(default):
            return _apply_rule(op, rule, args, kwargs, out_avals)
    return _apply_rule(op, rule, args, kwargs, out_avals)


def _apply_rule(op, rule, args, kwargs, out_avals) -> tuple:
    if rule.random:
        key_new, key_use = jax.random.split(args[-1])
        args = args[:-1]
        result = rule.fn(*args, key=key_use, **kwargs)
        results = result if isinstance(result, tuple) else (result,)
        return tuple(cast_to(r, a) for r, a in zip(results, out_avals[:-1])) + (key_new,)
    if out_avals and all(0 in a.shape for a in out_avals):  # nothing to compute (rules may fail on empty sizes)
        return tuple(jnp.zeros(a.shape, _dtypes.to_jax(a.dtype)) for a in out_avals)
    result = rule.fn(*args, **kwargs)
    results = result if isinstance(result, (tuple, list)) else (result,)
    if len(results) != len(out_avals):
        raise LoweringError(f"{op}: rule returned {len(results)} results, expected {len(out_avals)}")
    return tuple(cast_to(r, a) for r, a in zip(results, out_avals))


def _apply_foreach(op, spec, in_values: list, out_avals) -> tuple:
    """A foreach node: the element op's rule on each element (Note [Foreach nodes])."""
    outs: list = []
    for part in spec.parts:
        n = len(outs)
        vals = [in_values[p] for p in part.positions]
        outs.extend(apply_op(op.element, part.template, vals, out_avals[n : n + part.n_outputs]))
    return tuple(outs)


# Note [Packed scalars]: a program's lifted scalars (Note [Scalar lifting] in
# lazytpu.ir.node) reach it as one array per kind (float64, int64,
# complex128), after its buffers, not one argument each: JAX converts and
# transfers every Python-number argument at every call (about 2 µs each on
# XLA:CPU; on an accelerator, a transfer each), and XLA compiles a program
# with hundreds of scalar parameters more slowly. Inside the program each
# element becomes the weakly typed scalar a Python number traces to, so the
# rules see what they saw before. ``program_args`` packs a call's inputs.
# Numbers compiled in as constants (Note [Scalar specialization] in
# lazytpu.fusion.specialize) are not arguments; they become the same weakly
# typed scalars, of known value.
_PACKED = {float: np.float64, int: np.int64, complex: np.complex128}


def _layout(kinds: tuple) -> tuple[list[int], list[tuple[type, list[int]]], list[int]]:
    """The input positions of the buffers, of the scalars of each kind (in _PACKED's order),
    and of the numbers compiled in as constants (Note [Scalar specialization] in
    lazytpu.fusion.specialize). One pass, by identity: a buffer's kind is an Aval, whose hash
    a dict lookup would compute."""
    buffers: list[int] = []
    scalars: dict[type, list[int]] = {}
    constants: list[int] = []
    for i, k in enumerate(kinds):
        if k is float or k is int or k is complex:
            scalars.setdefault(k, []).append(i)
        elif type(k) is Constant:
            constants.append(i)
        else:
            buffers.append(i)
    return buffers, [(kind, scalars[kind]) for kind in _PACKED if kind in scalars], constants


def program_args(program, inputs: list, donate: tuple) -> tuple[list, tuple]:
    """The arguments of ``lower_program(program)`` for a call's ``inputs``
    (buffers and Python numbers in input order), and the positions among
    them of the donated buffers ``donate`` (input positions)."""
    buffers, scalars, constants = _layout(program.input_kinds)
    if not scalars and not constants:
        return inputs, donate
    args = [inputs[i] for i in buffers]
    args += [np.array([inputs[i] for i in positions], dtype=_PACKED[kind]) for kind, positions in scalars]
    if donate:
        position = {i: j for j, i in enumerate(buffers)}
        donate = tuple(position[i] for i in donate)
    return args, donate


# torch.get_float32_matmul_precision() -> JAX's default matmul precision (Note [Matmul precision])
MATMUL_PRECISIONS = {"highest": "highest", "high": "high", "medium": "default"}


def lower_program(program, matmul_precision: str = "highest") -> Callable:
    """A function ``f(*args) -> tuple(outputs)`` computing ``program``: its
    buffers, then its scalars packed (Note [Packed scalars]; ``program_args``).

    Note [Matmul precision]: ``torch.set_float32_matmul_precision`` picks the
    float32 passes of every product and convolution of a program whose rule
    leaves the precision to JAX: ``"highest"`` (torch's default) is full
    float32, as CPU torch computes; ``"high"`` and ``"medium"`` are the
    platform's faster passes (on TPU three and one bfloat16 passes, on GPU
    TF32). The setting in effect at the flush is part of the program's key
    (``DeviceContext.launch``), so changing it compiles the program again and
    changing it back takes the cached one. XLA:CPU computes float32 in every
    case.
    """
    run = _with_precision(_lower_unpacked(program), MATMUL_PRECISIONS[matmul_precision])
    kinds = program.input_kinds
    buffers, scalars, constants = _layout(kinds)
    if not scalars and not constants:
        return run
    n = len(kinds)

    def packed(*args):
        inputs: list = [None] * n
        for i, a in zip(buffers, args):
            inputs[i] = a
        for (_, positions), vector in zip(scalars, args[len(buffers) :]):
            for j, i in enumerate(positions):
                inputs[i] = _convert_element_type(vector[j], weak_type=True)
        for i in constants:  # the same weakly typed scalar, of a value XLA knows
            inputs[i] = _convert_element_type(np.array(kinds[i].value, _PACKED[kinds[i].kind]), weak_type=True)
        return run(*inputs)

    return packed


def _with_precision(run: Callable, precision: str) -> Callable:
    """``run``, traced under JAX's default matmul ``precision`` (Note [Matmul precision])."""

    def traced(*inputs):
        with jax.default_matmul_precision(precision):
            return run(*inputs)

    return traced


def _lower_unpacked(program) -> Callable:
    """A function ``f(*inputs) -> tuple(outputs)`` computing ``program`` (inputs in input order)."""
    ops = program.ops
    outputs = program.outputs

    def run(*inputs):
        env: list[tuple] = []
        for j, op in enumerate(ops):
            vals = [inputs[r[1]] if r[0] == "in" else env[r[0]][r[1]] for r in op.inputs]
            try:
                env.append(apply_op(op.op, op.spec, vals, op.out_avals))
            except LoweringError as exc:
                raise LoweringError(str(exc), j) from exc
            except Exception as exc:
                where = f" (recorded at {op.source})" if op.source else ""
                raise LoweringError(f"lowering {op.op} failed{where}: {exc}", j) from exc
        return tuple(env[j][k] for j, k in outputs)

    return run
