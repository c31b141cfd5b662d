"""The device context: the pending graph, the mode, record and flush.

This is where the stages meet: ops are recorded into the ``ir`` graph, and a
flush runs ``fusion`` -> ``lowering`` -> ``runtime`` and re-binds the results,
in the steps of Note [Flush steps] in lazytpu.engine_flush.

Note [Modes]: strict mode is defer mode with a flush after every recorded op;
there is one code path. strict-blocking also waits for each program.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import weakref
from collections.abc import Callable, Iterator

import torch

from lazytpu import _config, engine_flush, metrics, runtime
from lazytpu.engine_flush import DeferredCheck, located
from lazytpu.ir import Aval, Data, Node, Output, PendingGraph
from lazytpu.ir.graph import RandomCell
from lazytpu.ir.source import source_text
from lazytpu.lowering import lower_program, program_args
from lazytpu.runtime import keys
from lazytpu.runtime.platform import ForkState, check_not_forked
from lazytpu.runtime.transfer import failed

DEFAULT_SEED = 67280421310721  # torch's default CPU seed


class EagerMode(enum.Enum):
    """Execution modes, named as in TorchTPU."""

    DEFER_AND_FUSE = "defer"
    DEFER_NEVER = "strict"
    DEFER_NEVER_AND_LAUNCH_BLOCKING = "strict-blocking"

    @classmethod
    def parse(cls, value) -> EagerMode:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            for mode in cls:
                if value.lower() in (mode.value, mode.name.lower()):
                    return mode
        valid = ", ".join(m.value for m in cls)
        raise ValueError(f"invalid eager mode {value!r}: expected one of {valid} (or an EagerMode member)")


def _mode_from_env() -> EagerMode:
    raw = _config.EAGER_MODE.get()
    if raw is not None:
        try:
            return EagerMode.parse(raw)
        except ValueError:
            valid = ", ".join(m.value for m in EagerMode)
            raise ValueError(f"TORCHTPU_EAGER_MODE={raw!r} is not valid: expected one of {valid}") from None
    alias = _config.DEFER_AND_FUSE.get()
    if alias is not None:
        return EagerMode.DEFER_AND_FUSE if alias else EagerMode.DEFER_NEVER
    return EagerMode.DEFER_AND_FUSE


# Note [Step segments]: in defer mode a training step is dispatched in three
# programs, not one. The lane's pending values are flushed, without waiting,
# at two cut points: when a backward pass starts (the first op recorded inside
# an autograd graph task, ``torch._C._current_graph_task_id()`` no longer -1:
# ``DeviceContext.note_task``, before the op reads its inputs) and when
# ``optimizer.step()`` starts (a pre-hook in lazytpu.device.registration), if
# an op of a backward is pending
# (a step that read its loss after the backward has run that already). The
# device then computes the forward while the host records the backward, and
# the backward while it records the optimizer's update; only the last segment
# is left to wait for at the step's read. The cut points repeat every step,
# so each segment is a program cache hit in steady state. What a cut costs:
# the values that cross it are written out (mostly what autograd saved for
# the backward, which the fused program writes out too, and the gradients:
# Note [Step boundary]), and a view of a computed value is one more recorded
# op: about 5% more host CPU on the small transformers steps. Interleaved on
# a quiet 2-core XLA:CPU machine, one program per step is 1.10-1.29x slower
# (``python -m benchmarks --variants defer,defer_whole``: llama 1.15, gpt2
# 1.18, bert 1.12, mlp_b32 1.29, transformer 1.10); where no core is idle for
# the device (XLA:CPU under load) nothing overlaps and segments cost their
# 5-9%. A cut is a flush like any other: every value still equals CPU
# torch's. Only its failures wait (Note [Deferred failures]): a pending op
# that fails in a segment fails the values that depend on it, and its error
# is raised at the next host read, as a failed value check's is, never
# inside the user's backward pass or ``optimizer.step()``.
# ``LAZYTPU_STEP_SEGMENTS=0`` keeps one program per step. A call of a
# compiled graph (Note [Graphs as nodes] in lazytpu.compile.fx_lowering) cuts
# as an eager op does: the backward graph's call ends the forward's segment,
# which then runs while dynamo's, AOTAutograd's and the optimizer's host work
# goes on (``tpu_compile_whole/tpu_compile`` 1.11-1.28 in the benchmarks).
_graph_task = torch._C._current_graph_task_id


# Note [Engine observers]: the engine calls no module above it by name. A
# module that watches what the engine does registers a callback here when it
# is imported (``lazytpu.debug``, which ``lazytpu/__init__.py`` imports:
# recompile explanations and program dumps); the engine calls each callback
# of a kind, in the order registered, at each event of that kind:
#   "compile": ``fn(program, lowered)`` for each program compiled (a miss of
#   the program cache), with the fused ``Program`` and its ``jax.stages.Lowered``.
# A callback that raises fails that compile, as any error in compiling does.
OBSERVER_KINDS = ("compile",)
_OBSERVERS: dict[str, list[Callable]] = {kind: [] for kind in OBSERVER_KINDS}


def observe(kind: str, fn: Callable) -> Callable:
    """Call ``fn`` at each event of ``kind`` (Note [Engine observers]);
    returns ``fn``. A function registered twice for a kind is called once."""
    if kind not in _OBSERVERS:
        raise ValueError(f"unknown engine event {kind!r}: expected one of {', '.join(OBSERVER_KINDS)}")
    if fn not in _OBSERVERS[kind]:
        _OBSERVERS[kind].append(fn)
    return fn


def notify(kind: str, *args) -> None:
    """Call the observers of ``kind`` with ``args`` (Note [Engine observers])."""
    for fn in _OBSERVERS[kind]:
        fn(*args)


class Lane:
    """One thread's pending work on a device (Note [Lanes]).

    Note [Lanes]: each thread that records ops on a device has its own
    pending graph, so that a sync of one thread runs that thread's ops alone:
    threads that each train a model compile and compute exactly what they
    would one after another (ops of several threads fused in one program
    would make programs, and so compiles and rounding, depend on timing). The
    main thread has the device's first lane. Autograd runs backward ops on a
    thread of its own (Note [Graph ownership]), which borrows the lane of the
    tensors each op reads, so a backward records into its forward's lane.
    An op that reads a value still pending in another lane first runs that
    lane (a tensor handed from one thread to another is computed once); a
    tensor written by a thread moves to that thread's lane. The lanes of a
    device share its lock, its random state and its buffers' donation
    (Note [Donation]: a buffer another lane holds is never donated).
    """

    __slots__ = (
        "graph",
        "task",
        "backward",
        "thread",
        "checks",
        "value_checks",
        "computed_checks",
        "check_errors",
        "collective_runner",
        "cut_site",
    )

    def __init__(self, graph: PendingGraph, thread: threading.Thread | None) -> None:
        self.graph = graph
        self.task = -1  # the autograd graph task of its last op (Note [Step segments])
        self.backward = False  # some op pending was recorded by a backward pass
        self.thread = None if thread is None else weakref.ref(thread)
        self.checks: list = []  # Note [Deferred checks]
        # Note [Value checks] in lazytpu.frontend.checks.value_checks: recorded since the last flush, computed but not
        # read yet, and read but not raised yet
        self.value_checks: list = []
        self.computed_checks: list = []
        self.check_errors: list = []
        self.cut_site = None  # where the graph cap cut the last flush (Note [Graph depth])
        # Note [In-graph collectives] in lazytpu.distributed.ingraph: set while the pending graph holds a
        # collective; the next flush runs its program over the group's mesh, not on this device alone.
        self.collective_runner = None

    def idle(self) -> bool:
        """A lane of a thread that ended, with nothing left in it (the main lane never is)."""
        if self.thread is None:
            return False
        thread = self.thread()
        return (thread is None or not thread.is_alive()) and not self.graph.live_storages()


class DeviceContext:
    """Everything one device owns (Note [Graph ownership], Note [Lanes])."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.lock = threading.RLock()
        self.random = RandomCell()
        self.main = Lane(PendingGraph(self.lock, self.random, index), None)
        self.lanes: dict[int, Lane] = {id(self.main.graph): self.main}  # by id of their graph
        self._local = threading.local()
        self.seed = DEFAULT_SEED

    # -- lanes ----------------------------------------------------------
    def lane(self) -> Lane:
        """The calling thread's lane (for autograd's thread: the one it borrowed last)."""
        lane = getattr(self._local, "lane", None)
        if lane is None:
            thread = threading.current_thread()
            if thread is threading.main_thread() or isinstance(thread, threading._DummyThread):
                lane = self.main  # a thread torch started (autograd's) borrows lanes: see lane_for
            else:
                with self.lock:
                    lane = Lane(PendingGraph(self.lock, self.random, self.index), thread)
                    self.fold_metrics()  # the ops of the idle lanes dropped here stay counted
                    self.lanes = {k: v for k, v in self.lanes.items() if not v.idle()}
                    self.lanes[id(lane.graph)] = lane
            self._local.lane = lane
            self._local.borrows = isinstance(thread, threading._DummyThread)
        return lane

    @property
    def graph(self) -> PendingGraph:
        """The calling thread's pending graph."""
        return self.lane().graph

    def lane_of(self, storage) -> Lane:
        return self.lanes[id(storage.graph)]

    def lane_for(self, storage, lane: Lane, first: bool) -> Lane:
        """The lane an op recording in ``lane`` records into, given that it
        reads a tensor on ``storage`` of another lane (Note [Lanes]):
        autograd's thread borrows the lane of the ``first`` tensor an op reads;
        any other thread keeps its own, once the other lane has run if
        ``storage`` is pending there."""
        if first and self._local.borrows:
            lane = self._local.lane = self.lanes[id(storage.graph)]
            return lane
        if type(storage.value) is Output:
            self.flush("cross_thread", lane=self.lane_of(storage))
        return lane

    @property
    def collective_runner(self):
        return self.lane().collective_runner

    @collective_runner.setter
    def collective_runner(self, runner) -> None:
        self.lane().collective_runner = runner

    def fold_metrics(self) -> None:
        """Add the ops recorded in each lane since the last fold to the
        metrics' ``ops_recorded`` (its graph's ``recorded_ops`` is the count)."""
        with self.lock:
            ops = 0
            for lane in self.lanes.values():
                graph = lane.graph
                ops += graph.recorded_ops - graph.folded_ops
                graph.folded_ops = graph.recorded_ops
            if ops:
                metrics.add("ops_recorded", ops)

    # -- random state ---------------------------------------------------
    def manual_seed(self, seed: int) -> None:
        with self.lock:
            self.seed = int(seed) & 0xFFFFFFFFFFFFFFFF  # as torch.initial_seed() gives it
            self.random.value = keys.seed_key(self.seed, self.index)

    def rng_value(self):
        if self.random.value is None or failed(self.random.value):  # Note [Failed buffers]
            if self.random.value is not None:
                engine_flush.warn_reseeded(self.index)
            self.manual_seed(self.seed)
        return self.random.value

    def get_rng_state(self) -> torch.Tensor:
        with self.lock:
            value = self.rng_value()
            if isinstance(value, Output):
                self.flush("rng_state")
                value = self.random.value
            return torch.from_numpy(keys.key_bytes(value)).clone()  # resizable, as a CPU state is

    def set_rng_state(self, state: torch.Tensor) -> None:
        with self.lock:
            self.random.value = keys.bytes_key(state.cpu().clone().numpy(), self.index)  # numpy() would fix its size

    # -- record / flush -------------------------------------------------
    def recorded(self, node: Node, flush: bool = True, task: bool = True, lane: Lane | None = None) -> None:
        """Called after a node is recorded: strict mode flushes here.

        ``ops_recorded`` is counted here, in the graph's ``recorded_ops``,
        without the metrics lock (we hold the graph's), and folded into the
        metrics at each flush and snapshot (``fold_metrics``).
        ``flush=False`` while some output is not bound to a storage yet (a
        view's read, an input of the op being recorded; an op's outputs bound
        one by one): a flush then could donate a buffer that output still
        needs (Note [Donation]). The op flushes once all are bound.
        ``task=False`` where the op's autograd graph task was noted before it
        read its inputs (``record``, a compiled graph's call): Note [Step
        segments].
        """
        lane = lane or self.lane()  # the calling thread's (record passes the one it found)
        lane.graph.recorded_ops += 1
        if flush:
            self.flush_if_due(task, node.depth, lane, node)

    def flush_if_due(self, task: bool = True, depth: int = 0, lane: Lane | None = None, node=None) -> None:
        """Strict mode flushes after each op; deferred mode at the start of a
        backward pass (Note [Step segments]) and at the graph cap (Note [Graph
        depth] in lazytpu.ir.node): as many ops pending, an op ``depth`` deep,
        or past half of either at the op (``node``) where the cap cut last."""
        if MODE.current is not EagerMode.DEFER_AND_FUSE:
            self.flush("strict")
            if MODE.current is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING:
                self.read_value_checks()  # the op's program has finished: its checks' errors at its line
            return
        lane = lane or self.lane()
        if task:
            self.note_task(lane)  # the ops that record() does not record
        fill = max(lane.graph.pending_ops / _config.MAX_PENDING_OPS.get(), depth / _config.MAX_PENDING_DEPTH.get())
        site = None if node is None or fill < 0.5 else (node.static, node.source)  # OpSigs compare by identity
        if fill >= 1 or (site is not None and site == lane.cut_site):
            self.flush("graph_cap", lane=lane)
            lane.cut_site = site

    def note_task(self, lane: Lane) -> None:
        """Before an op records into ``lane``: the first op of a backward pass
        ends the forward's segment (Note [Step segments])."""
        task = _graph_task()
        if task != lane.task:
            lane.task = task
            if task != -1 and MODE.current is EagerMode.DEFER_AND_FUSE and _config.STEP_SEGMENTS.get():
                self.flush("segment", lane=lane, quiet=True)
        if task != -1:
            lane.backward = True

    def segment(self) -> None:
        """The start of ``optimizer.step()``: dispatch the backward's segment,
        without waiting, if one is pending (Note [Step segments])."""
        lane = self.lane()
        if lane.backward and MODE.current is EagerMode.DEFER_AND_FUSE and _config.STEP_SEGMENTS.get():
            self.flush("segment", lane=lane, quiet=True)

    def defer_check(self, check: DeferredCheck) -> None:
        """Run ``check`` after the next flush (Note [Deferred checks]).

        Note [Deferred checks]: some ops only validate their inputs' values
        (``_linalg_check_errors`` on LAPACK's ``info``). Reading a pending
        value at the op would cut the program there; instead the check (a
        closure holding the tensors it reads, so that they are program
        outputs) runs right after the flush that materializes them, and the
        flush raises torch's own error, naming the user's line that recorded
        the op: at the latest when a result of the checked op is read, never
        later. The values that depend on the checked op fail with the error;
        every other value keeps its result (Note [Failure isolation] in
        lazytpu.fusion.program). A check whose op failed is dropped.
        """
        with self.lock:
            self.lane().checks.append(check)

    def watch_values(self, check) -> None:
        """Read ``check`` (a ``value_checks.PendingValueCheck``) once a flush has computed it (Note [Value checks])."""
        self.lane().value_checks.append(check)

    def read_value_checks(self) -> None:
        """Raise the first failed value check of the calling thread's ops that
        the device has computed (Note [Value checks]): never waits for the
        device. The values that depend on the checked op fail with its error."""
        lane = self.lane()
        if not (lane.computed_checks or lane.check_errors):
            return
        with self.lock:
            self._read_value_checks(lane)
            errors, lane.check_errors = lane.check_errors, []
        if errors:
            raise engine_flush.raised(errors[0])

    def _read_value_checks(self, lane: Lane) -> None:
        """Read the value checks the device has computed into ``check_errors``
        (a flush does too, to let go of them early; only a host read raises,
        so that where an error shows does not depend on the device's timing)."""
        errors, waiting = lane.check_errors, []
        for pending in lane.computed_checks:
            result = pending.result.value
            if type(result) is not Data or failed(result):  # its op failed (Note [Failed buffers])
                continue
            if not result.buffer.is_ready():
                waiting.append(pending)
                continue
            at, bits = (int(v) for v in runtime.to_host(result.buffer))
            if at < 0:
                continue
            plan, check = pending.plan, pending.check
            error = located(
                plan.error(check, at, plan.value(check, bits)), str(plan.func), source_text(pending.node.source)
            )
            errors.append(error)
            if not pending.harmless:  # Note [Failed writes change nothing] in lazytpu.frontend.checks.value_checks
                engine_flush.fail_reached(pending, [other.graph for other in self.lanes.values()], error)
        lane.computed_checks = waiting

    def end_step(self) -> None:
        """The end of ``optimizer.step()``: a sync point, dispatched lazily (Note [Step boundary])."""
        metrics.count("syncs", "optimizer_step")
        with self.lock:
            lane = self.lane()
            if lane.collective_runner is not None:  # every rank's program must run: no waiting
                self.flush("optimizer_step", count=False, lane=lane)
            elif lane not in STEPS_DUE:
                STEPS_DUE[lane] = self

    def flush(self, reason: str, count: bool = True, lane: Lane | None = None, quiet: bool = False) -> None:
        """Materialize every live pending value of ``lane`` (default: the
        calling thread's, Note [Lanes]) in one program, in the steps of Note
        [Flush steps] in lazytpu.engine_flush.

        ``count=False`` for a step boundary's flush, counted at the boundary.
        ``quiet=True`` for a step segment's: a failure is raised at the
        lane's next host read instead (Note [Step segments]).
        """
        with self.lock:
            lane = lane or self.lane()
            if lane.computed_checks:  # let go of the value checks computed since (Note [Value checks])
                self._read_value_checks(lane)
            roots, runner = self.collect(lane, reason, count)
            if not roots:
                return
            results, failures = engine_flush.run(self, roots, runner)
            errors = engine_flush.rebind(lane, roots, results, failures)
            if errors and lane.check_errors:  # raised by the next host read, wherever the device's timing read them
                errors = [e for e in errors if not any(e is c for c in lane.check_errors)]
            if errors and quiet:
                lane.check_errors.append(errors[0].with_traceback(None))
            elif errors:  # the first failure, once: every value it reached keeps it
                raise engine_flush.raised(errors[0])

    def collect(self, lane: Lane, reason: str, count: bool) -> tuple[list, Callable]:
        """Step 1 of a flush of ``lane`` (Note [Flush steps]): the pending
        values it must materialize, and the runner of their program (taken:
        the next flush runs on this device alone again).

        Counts the sync (unless not ``count``); takes the lane off the steps
        due (Note [Step boundary]). With no roots, whatever was pending is dead
        or materialized: the graph forgets it.

        Note [Runner effects]: a runner may name pending values that must be
        computed even when no tensor holds them (``effects``): the program of
        an in-graph collective runs on every rank of its group, so a rank that
        dropped a collective's result (rank 1 discarding a gathered state dict
        that rank 0 keeps) must still run it, or the others wait for it forever.
        """
        graph = lane.graph
        lane.backward = False
        lane.cut_site = None  # the graph cap sets it again after its flushes
        self.fold_metrics()
        if STEPS_DUE:
            STEPS_DUE.pop(lane, None)
        roots = graph.roots(prune=True)
        if count:
            metrics.count("syncs", reason)
        runner, lane.collective_runner = lane.collective_runner or runtime.execute, None
        for effect in getattr(runner, "effects", ()):
            if effect not in roots:
                roots.append(effect)
        if not roots:
            graph.forget_pending()
        return roots, runner

    def flush_all(self, reason: str) -> None:
        """Flush every lane of this device (the calling thread's first)."""
        with self.lock:
            first = self.lane()
            self.flush(reason, lane=first)
            for lane in list(self.lanes.values()):
                if lane is not first and lane.graph.pending:
                    self.flush(reason, lane=lane)

    def donated(self, program, inputs: list, roots: list) -> tuple:
        """Step 3 of a flush (Note [Flush steps]): the positions of the input
        buffers no lane's storage holds and no other lane's pending values
        read (Note [Donation]); ``roots`` are the values this program computes."""
        graphs = [lane.graph for lane in self.lanes.values()]
        held = set().union(*(graph.held_buffers() for graph in graphs))
        if len(graphs) > 1:
            computed = set(roots)
            held.update(*(graph.buffers_read_outside(computed) for graph in graphs))
        kinds = program.input_kinds
        return tuple(
            i for i, (kind, buf) in enumerate(zip(kinds, inputs)) if isinstance(kind, Aval) and id(buf) not in held
        )

    def launch(self, program, inputs: list, donate: tuple, runner) -> tuple:
        """Steps 4-6 of a flush (Note [Flush steps]): ``runner``
        (``runtime.execute``) looks the program up in the program cache,
        compiles it on a miss (lowering it with ``lower_program``; the compile
        observers see it) and executes it on this device.

        Returns:
            The output buffers, in the order of the program's outputs.
        """
        args, donated = program_args(program, inputs, donate)  # Note [Packed scalars]
        precision = torch.get_float32_matmul_precision()  # Note [Matmul precision] in lazytpu.lowering.to_jax
        return runner(
            (program.key, donate, self.index, precision),
            lambda: lower_program(program, precision),
            args,
            index=self.index,
            blocking=MODE.current is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING,
            donate=donated,
            on_compile=lambda lowered: notify("compile", program, lowered),
        )


class _ModeState:
    """The process-wide eager mode (autograd's thread must see it too)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current = _mode_from_env()

    def set(self, mode) -> None:
        mode = EagerMode.parse(mode)
        if mode is not self.current:
            sync_all("mode_switch")
        self.current = mode

    @contextlib.contextmanager
    def scoped(self, mode) -> Iterator[None]:
        old = self.current
        self.set(mode)
        try:
            yield
        finally:
            self.set(old)


MODE = _ModeState()
_CONTEXTS: dict[int, DeviceContext] = {}
_CONTEXTS_LOCK = threading.Lock()


def contexts() -> list[DeviceContext]:
    """The device contexts made so far."""
    with _CONTEXTS_LOCK:
        return list(_CONTEXTS.values())


def context(index: int = 0) -> DeviceContext:
    if ForkState.bad_fork:
        check_not_forked()
    ctx = _CONTEXTS.get(index)
    if ctx is None:
        if index:  # tpu:0 starts no PJRT client here
            runtime.platform.checked_index(index)
        with _CONTEXTS_LOCK:
            ctx = _CONTEXTS.setdefault(index, DeviceContext(index))
    return ctx


# Note [Step boundary]: the end of ``optimizer.step()`` is a sync point (one
# program per step in a loop that never reads a value), but its flush waits
# for the next op recorded on the device, or any other sync. In between, a
# training loop drops the step's gradients (``zero_grad(set_to_none=True)``,
# torch's default), so the step's program need not write them out: a jitted
# JAX step keeps its gradients internal too. Writing them costs memory on an
# accelerator (a parameter-sized buffer per step) and 7-11% of the program on
# XLA:CPU for a small MLP (``python -m benchmarks.floor``). A step whose
# gradients are still referenced writes them as before; a value read always
# syncs first. With step segments (Note [Step segments], the default) the
# backward's program writes the gradients out, since the optimizer's program
# reads them; ``LAZYTPU_STEP_SEGMENTS=0`` keeps them internal. The wait
# costs no throughput: each step's dispatch moves by the same host time (the
# next op comes with the next step), so the device sees one program per step
# as before; a loop that reads the loss every step syncs at the read, as
# before. A copy from the host (``x.to("tpu")``, the next batch)
# and a view (``loss.detach()``) compute nothing and do not end the wait
# (``dispatch._ends_step_wait``); any other op, a compiled graph's call and
# every other sync do, before they read a value. A step whose program holds an
# in-graph collective (``lazytpu.distributed.ingraph``) is dispatched at once:
# another rank may wait for it in a host collective (``dist.barrier()``)
# without recording an op.
# The lanes whose step ended, with their devices; each thread's next op
# dispatches its own lane's step only (Note [Lanes]: another thread's op must
# not dispatch it before that thread drops its gradients).
STEPS_DUE: dict[Lane, DeviceContext] = {}


def run_due_steps() -> None:
    """Dispatch the programs of the calling thread's steps that ended (Note [Step boundary])."""
    check_not_forked()  # a forked child inherits the table, not the device
    for lane, ctx in list(STEPS_DUE.items()):
        if lane is ctx.lane():
            ctx.flush("optimizer_step", count=False, lane=lane)


def _fold_all() -> None:
    for ctx in list(_CONTEXTS.values()):
        ctx.fold_metrics()


metrics.register_folder(_fold_all)


def sync_all(reason: str) -> None:
    """Flush every device, every lane."""
    for ctx in list(_CONTEXTS.values()):
        ctx.flush_all(reason)
