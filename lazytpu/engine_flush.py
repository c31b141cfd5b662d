"""The steps of a flush, which ``DeviceContext.flush`` in lazytpu/engine.py runs.

Note [Flush steps]: a flush of one lane (Note [Lanes] in lazytpu.engine) runs
these steps in order, all under the device's lock:

1. collect (``DeviceContext.collect``): the pending values that live tensors
   of the lane still need (the roots, Note [Deterministic roots] in
   lazytpu.ir.graph), and the runner of the program (``runtime.execute``, or
   the runner of a program that holds a collective). A flush with no roots
   stops here.
2. key (``fusion.build_program``, called by ``run``): the roots as one
   ``Program`` with a canonical key, and its input buffers.
3. donate (``DeviceContext.donated``): the inputs no lane still holds
   (Note [Donation]); part of the cache key.
4. cached? (``runtime.executor.run_program``: ``_ProgramCache.lookup``): the
   program compiled before for (key, donated inputs, device).
5. compile, on a miss (``runtime.executor.compile_program``): aten ops ->
   a JAX function (``lowering.lower_program``), ``jax.jit`` lowering, the
   compile observers (Note [Engine observers] in lazytpu.engine), then XLA's
   compile or the persistent cache.
6. execute (``runtime.executor.run_compiled``): dispatch on the device;
   steps 4-6 are ``DeviceContext.launch``, which hands the program to the
   runner.
7. rebind (``rebind``): each root's storage is bound to its result buffer,
   or to ``Failed`` (Note [Deferred failures] in lazytpu.ir.node); the deferred
   checks run and the value checks get the storages they guard.

A failure in steps 2-6 fails only the roots that depend on it: ``run`` runs
the others again, from step 2 (Note [Failure isolation] in
lazytpu.fusion.program). The flush then raises the first error.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable

import attrs
import jax
import numpy as np
import torch

from lazytpu import _caches, metrics, runtime
from lazytpu.fusion import FailedInput, build_program, op_node, split_roots
from lazytpu.ir import Aval, Data, Failed, Output, Scalar
from lazytpu.ir.source import user_stacklevel


def run(ctx, roots: list, runner, first: bool = True) -> tuple[dict, dict]:
    """Steps 2-6 for ``roots`` on the device of ``ctx`` (a
    ``DeviceContext``): key, donate, cached?, compile, execute. On a
    failure, run again what does not depend on the failing op (Note
    [Failure isolation]); only the ``first`` attempt donates.

    Returns:
        ``{root: Data}`` for the values computed and ``{root: error}`` for
        those that failed.
    """
    try:
        # Note [Numbers of multi-process programs]: a program that another rank runs too (its
        # collectives make it one SPMD program over the processes' mesh) never compiles its
        # Python numbers in as constants (Note [Scalar specialization] in lazytpu.fusion.specialize).
        # Each process compiles its own copy of the program, and XLA takes it for the same program
        # on every device: a number that differs by rank (``torch.full((2,), float(rank))``) would
        # be a constant it may fold through a collective as if every rank had it (an all-gather of
        # it gave rank 0's value everywhere). Runtime inputs are each process's own.
        program, inputs, distinct = build_program(roots, specialize_numbers=runner is runtime.execute)
    except FailedInput as exc:
        return without(ctx, roots, [exc.node], exc.error, runner)
    # A retry donates nothing: a failed attempt may have left a donated input to a part
    # that still needs it.
    donate = ctx.donated(program, inputs, roots) if first else ()
    try:
        outs = ctx.launch(program, inputs, donate, runner)
    except Exception as exc:
        error = _program_error(exc, program)
        error.__cause__ = exc
        if runner is not runtime.execute:  # another rank runs this program too: no retries
            return {}, dict.fromkeys(distinct, error)
        index = getattr(exc, "op_index", None)
        if index is not None:
            return without(ctx, roots, [op_node(roots, index)], error, runner)
        if len(distinct) == 1:
            return {}, {distinct[0]: error}
        half = len(distinct) // 2
        done, failed = run(ctx, distinct[:half], runner, first=False)
        more_done, more_failed = run(ctx, distinct[half:], runner, first=False)
        return done | more_done, failed | more_failed
    return {r: Data(buf, r.aval) for r, buf in zip(distinct, outs)}, {}


# Note [Constant reads]: a host read of a pending value that depends on no
# device buffer, whose ops read nothing but Python numbers (a mask made from
# ``torch.arange``, which transformers' ``find_packed_sequence_indices`` reads
# in every Llama and GPT-2 forward), is a function of its program's key and
# numbers alone. The first read computes it alone and binds its storage to
# the result, as a flush would (so a value that keeps changing between reads,
# a counter's ``add_``, reads its last result instead of growing a chain
# whose every length is a new program); its small host value is kept by that
# key (``constant_value``). A later read of the same computation runs no
# program and leaves its lane pending, so the ops recorded before it stay in
# the step's program instead of being cut off into a program of their own.
# Values that a deferred or value check guards, and a lane with a collective
# pending, take the usual path: a flush of the lane.
_CONSTANT_READS = _caches.memo("constant_reads", limit=256)
_CONSTANT_OPS = 256  # the most ops a constant read walks and computes
_CONSTANT_BYTES = 4096  # the largest value kept


def constant_value(ctx, lane, storage) -> np.ndarray | None:
    """The host value of ``storage``'s pending value (in ``lane``) if it is a
    constant read (Note [Constant reads]), computed once per program key and
    numbers; else None: the caller flushes the lane."""
    if lane.collective_runner is not None:
        return None
    with ctx.lock:
        root = storage.value
        if type(root) is not Output or root.aval.nbytes > _CONSTANT_BYTES:
            return None
        nodes = _constant_nodes(root.node)
        if (
            nodes is None
            or any(id(g.node) in nodes for check in lane.checks for g in check.guards)
            or any(id(pending.node) in nodes for pending in lane.value_checks)
        ):
            return None
        program, inputs, _ = build_program([root])
        key = (program.key, tuple(map(_exact, inputs)), torch.get_float32_matmul_precision(), ctx.index)
        value = _CONSTANT_READS.get(key)
        if value is None:
            results, failures = run(ctx, [root], runtime.execute)
            if failures:  # the lane's flush raises it, where it belongs
                return None
            storage.value = results[root]  # computed, as a flush binds it
            value = np.array(runtime.to_host(storage.value.buffer), copy=True)
            value.flags.writeable = False
            _CONSTANT_READS[key] = value
    metrics.add("constant_reads")
    return value


def _constant_nodes(node) -> set[int] | None:
    """The ids of the nodes ``node`` depends on, if none reads a device
    buffer (or a failed value) and they are few; else None."""
    seen, todo = {id(node)}, [node]
    while todo:
        for v in todo.pop().inputs:
            kind = type(v)
            if kind is Output:
                if id(v.node) not in seen:
                    if len(seen) >= _CONSTANT_OPS:
                        return None
                    seen.add(id(v.node))
                    todo.append(v.node)
            elif kind is not Scalar:
                return None
    return seen


def _exact(number) -> tuple:
    """A lifted number as a key that tells ``0.0`` from ``-0.0`` and ``1`` from ``True``."""
    if type(number) is float:
        return float, number.hex()
    if type(number) is complex:
        return complex, number.real.hex(), number.imag.hex()
    return type(number), number


def without(ctx, roots: list, culprits: list, error: BaseException, runner) -> tuple[dict, dict]:
    """Fail the roots that reach ``culprits`` with ``error``; ``run`` the rest."""
    reaching, others = split_roots(roots, culprits)
    failed = dict.fromkeys(reaching, error)
    if not others:
        return {}, failed
    done, more_failed = run(ctx, others, runner, first=False)
    return done, failed | more_failed


def raised(error: BaseException) -> BaseException:
    """``error``, marked as raised to the user (``rebind`` returns it no more)."""
    error._lt_raised = True
    return error.with_traceback(None)


def rebind(lane, roots: list, results: dict, failures: dict) -> list:
    """Step 7: bind the storages of ``lane`` (a ``Lane``) that held ``roots``
    to their ``results``, or to their ``failures``; then hand the lane's value
    checks what they guard (Note [Value checks] in
    lazytpu.frontend.checks.value_checks) and run its deferred checks (Note
    [Deferred checks] in lazytpu.engine): a check that fails fails every value
    that depends on its op.

    Returns:
        The errors the flush raises the first of: the program failures, each
        once (not one already raised, which a later program carries to the
        values that read a failed one: ``raised``), then the failed checks'.
    """
    graph = lane.graph
    checks, lane.checks = lane.checks, []
    checks = [c for c in checks if not any(g in failures for g in c.guards)]  # nothing to check
    guarded = [split_roots(list(results), [g.node for g in c.guards])[0] for c in checks]
    settled = graph.settle(results, failures)
    if lane.computed_checks or lane.value_checks:
        weak = graph.weakly(settled)
        for pending in lane.computed_checks:  # computed by an earlier program, not read yet
            spread(pending, roots, weak)
        for pending in lane.value_checks:
            pending.roots, pending.settled = roots, weak
        lane.computed_checks += lane.value_checks
        lane.value_checks = []
    errors = [e for e in dict.fromkeys(failures.values()) if not getattr(e, "_lt_raised", False)]
    for check, reaching in zip(checks, guarded):
        error = check.error()
        if error is not None:
            errors.append(error)
            failures.update(dict.fromkeys(reaching, error))
            graph.fail_values(settled, failures)
    return errors


# Note [Checks across programs]: a value check is read after its program ran
# (Note [Value checks] in lazytpu.frontend.checks.value_checks), and a later
# program may have read the checked op's results by then: in strict mode every
# op is its own program (``y = x[bad]; z = y + 1``), and a step segment's
# values feed the next segment. A failed check fails every value computed
# from its op, in any program, and every tensor holding one: the buffers its
# op's values were bound to are its ``reached`` buffers, each later program
# that reads one adds the buffers of its values that depend on it (``spread``,
# a walk of that program only while an unread check holds buffers it reads),
# and a failed check re-binds every live storage holding one of them
# (``fail_reached``), whichever tensor it has moved to since (an in-place
# op's target re-bound to its result's buffer), and every pending value that
# reads one (a flush reads the checks computed before it collects its roots).


def reached(pending) -> dict:
    """``{id(buffer): weakref}``: the buffers holding values that ``pending``
    (a ``PendingValueCheck`` whose program ran) fails (Note [Checks across programs])."""
    if pending.reached is None:
        reaching = set(split_roots(pending.roots, [pending.node], keys_pass=True)[0])
        pending.reached = {
            id(buffer()): buffer
            for _, value, buffer in [*pending.settled, *pending.extra]
            if value in reaching and buffer() is not None
        }
    return pending.reached


def spread(pending, roots: list, settled: list) -> None:
    """Add to ``pending``'s reached buffers those of this program's values
    (``roots``, bound as ``settled``, weakly) computed from one of them."""
    buffers = reached(pending)
    if not buffers:
        return
    reaching = set(split_roots(roots, (), buffers, keys_pass=True)[0])
    for _, value, buffer in settled:
        if value in reaching and buffer() is not None:
            buffers[id(buffer())] = buffer


def fail_reached(pending, graphs, error: BaseException) -> None:
    """Re-bind to ``Failed`` with ``error`` every live storage of ``graphs``
    that holds a buffer ``pending`` reached, or a pending value that reads one."""
    buffers = reached(pending)
    for graph in graphs:
        for storage in graph.live_storages():
            value = storage.value
            if type(value) is Data:
                ref = buffers.get(id(value.buffer))
                if ref is not None and ref() is value.buffer:
                    storage.value = Failed(error, value.aval)
        waiting = graph.pending_storages()
        if waiting:
            reaching = set(split_roots([s.value for s in waiting], (), buffers, keys_pass=True)[0])
            for storage in waiting:
                if storage.value in reaching:
                    storage.value = Failed(error, storage.value.aval)


def _program_error(exc: Exception, program) -> Exception:
    """The error a user sees for a failed program (Note [Deferred failures]):
    which op and the user's file:line that recorded it (a lowering failure),
    else where the program's ops were recorded; ``torch.OutOfMemoryError``
    with the sizes involved."""
    from lazytpu.lowering import LoweringError

    if isinstance(exc, LoweringError):
        message = str(exc)  # names the op and its source (lowering/to_jax.py)
    else:
        message = f"{type(exc).__name__}: {exc}{_recorded_at(program)}"
    if _out_of_memory(message):
        inputs = sum(k.nbytes for k in program.input_kinds if isinstance(k, Aval))
        outputs = sum(a.nbytes for a in program.output_avals)
        return torch.OutOfMemoryError(
            f"lazytpu: out of device memory running a program of {len(program.ops)} ops "
            f"(inputs {inputs / 2**20:.1f} MiB, outputs {outputs / 2**20:.1f} MiB): {message}"
        )
    return RuntimeError(f"lazytpu: a deferred program failed: {message}")


def _out_of_memory(message: str) -> bool:
    return "RESOURCE_EXHAUSTED" in message or "out of memory" in message.lower()


def _recorded_at(program, shown: int = 3) -> str:
    """Where a failed program's ops were recorded, e.g. `` (ops recorded at
    train.py:12, train.py:14 and 3 more places)``."""
    places = list(dict.fromkeys(op.source for op in program.ops if op.source))
    if not places:
        return ""
    more = f" and {len(places) - shown} more places" if len(places) > shown else ""
    return f" (ops recorded at {', '.join(places[:shown])}{more})"


@attrs.frozen(slots=True)
class DeferredCheck:
    """A check of values an op computed (Note [Deferred checks]).

    ``run`` raises torch's error for bad values, read once computed;
    ``guards`` are the op's pending outputs: if the check fails, every value
    that depends on them fails with its error (Note [Failure isolation]);
    ``op`` and ``where`` (the user's ``file:line``) name what recorded it.
    """

    run: Callable[[], None]
    guards: tuple[Output, ...]
    op: str
    where: str | None

    def error(self) -> BaseException | None:
        """torch's error for the checked values (``located``); else None."""
        try:
            self.run()
        except Exception as exc:  # noqa: BLE001 - torch's error, raised by the flush
            return located(exc, self.op, self.where)
        return None


def located(exc: BaseException, op: str, where: str | None) -> BaseException:
    """``exc`` as torch raised it, its message naming the op and the user's line."""
    if not where:
        return exc
    return type(exc)(f"{exc} ({op} recorded at {where})").with_traceback(None)


def warn_reseeded(index: int) -> None:
    """A device's random key failed with its program (Note [Failed buffers] in lazytpu.runtime.transfer)."""
    warnings.warn(
        f"lazytpu: tpu:{index}'s random state was lost with a failed program; re-seeded", stacklevel=user_stacklevel()
    )


@contextlib.contextmanager
def failures_as_torch_errors():
    """A program's failure as it ran, read from its outputs (Note [Failed buffers] in
    lazytpu.runtime.transfer), raised as torch's error: out of memory is ``torch.OutOfMemoryError``."""
    try:
        yield
    except jax.errors.JaxRuntimeError as exc:
        if _out_of_memory(str(exc)):
            raise torch.OutOfMemoryError(f"lazytpu: out of device memory: {exc}") from exc
        raise
