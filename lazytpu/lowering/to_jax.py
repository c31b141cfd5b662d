"""Lower a fused ``Program`` to one pure JAX function."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch

from lazytpu import _dtypes
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
        x = jnp.broadcast_to(x, aval.shape)
    return x


def apply_op(op, spec, in_values: list, out_avals) -> tuple:
    """Run one op's rule on JAX values; returns its outputs, cast."""
    if type(op) is ForeachOp:
        return _apply_foreach(op, spec, in_values, out_avals)
    rule = get_rule(op)
    args, kwargs = fill(spec, in_values)
    if rule.random:
        key_new, key_use = jax.random.split(args[-1])
        args = args[:-1]
        result = rule.fn(*args, key=key_use, **kwargs)
        results = result if isinstance(result, tuple) else (result,)
        return tuple(cast_to(r, a) for r, a in zip(results, out_avals[:-1])) + (key_new,)
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


def lower_program(program) -> Callable:
    """A function ``f(*inputs) -> tuple(outputs)`` computing ``program``."""
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
