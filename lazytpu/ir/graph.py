"""The pending graph: storages of live tensors and what they hold.

Note [Storage]: a ``Storage`` is the mutable cell tensors read: it holds a
``Data`` (materialized) or an ``Output`` (pending). A tensor and all its views
(``detach``, ``.data``, slices, transposes, ...) share one storage, each with
its own (size, stride, offset) window, as in torch; a write through any of
them records a new node and re-binds the storage, so all see it. Nodes
themselves never change.

Every storage that holds a pending value is in the graph's weak registry; a
storage that dies takes its pending work with it (nothing reaches the node any
more, so a sync never computes it).

Note [Deterministic roots]: a sync's roots are taken in the order their
storages first became pending. Any order that depends on memory addresses
would make the same loop produce differently ordered programs, and so new
program keys and recompiles, step after step.
"""

from __future__ import annotations

import threading
import weakref

from lazytpu.ir.node import Data, Failed, Output


class Storage:
    """The mutable value cell shared by aliasing tensors.

    ``value`` is a logical array of the base layout: shape ``value.aval.shape``
    and memory strides ``stride`` (Note [Views as strides] in lowering/strided).
    """

    __slots__ = ("value", "graph", "stride", "__weakref__")

    def __init__(self, value, graph: PendingGraph, stride: tuple[int, ...]) -> None:
        self.value = value
        self.graph = graph
        self.stride = stride
        ref = weakref.ref(self)
        graph.storages.append(ref)
        if type(value) is Output:
            graph.pending.append(ref)

    def bind(self, value, graph: PendingGraph | None = None) -> None:
        """Re-bind to a new value (an in-place write or a sync's result),
        recorded in ``graph`` (default: its own; a storage that is not pending
        moves to the graph that writes it: Note [Lanes] in lazytpu.engine)."""
        if graph is not None and graph is not self.graph and type(self.value) is not Output:
            self.graph = graph
            graph.storages.append(weakref.ref(self))
        self.value = value
        if type(value) is Output:
            self.graph.pending.append(weakref.ref(self))

    @property
    def pending(self) -> bool:
        return type(self.value) is Output

    @property
    def numel(self) -> int:
        n = 1
        for d in self.value.aval.shape:
            n *= d
        return n


class RandomCell:
    """A device's PRNG key, shared by its graphs.

    Note [Random state]: a device's random state is one JAX PRNG key, a
    program input and output: a random op's node takes the current key as its
    last input and gives the next one as its last output (the rule draws from a
    split of it, ``lowering.to_jax.apply_op``), which becomes the key the next
    random op reads. The lanes of a device share this cell;
    ``torch.manual_seed`` replaces the key, so runs are reproducible.
    """

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = None


class PendingGraph:
    """Live storages with pending values, plus the device's PRNG state.

    Note [Graph ownership]: one graph per device and recording thread, owned
    by the device's context (Note [Lanes] in lazytpu.engine), all behind the
    device's one re-entrant lock. Autograd runs backward ops on its own
    thread, which records into the graph of the tensors each op reads: a
    graph per plain thread-local would split a step's forward and backward
    apart.

    Storages are tracked by plain weak references (no callbacks: cheap on the
    per-op path); dead ones are skipped and pruned at each sync.
    """

    def __init__(self, lock=None, random=None, index: int = 0) -> None:
        # a device's graphs (one per thread: Note [Lanes] in lazytpu.engine) share its lock and
        # its random state (an object with a ``value``); ``index``: the device's, the one place a
        # tensor's device index is kept (its storage's graph: Note [Device index])
        self.index = index
        self.lock = lock if lock is not None else threading.RLock()
        self._random = random if random is not None else RandomCell()
        # Storages that became pending since the last sync, in order
        # (Note [Deterministic roots]); may repeat and may be dead.
        self.pending: list[weakref.ref] = []
        # Every storage (Note [Donation]); pruned at each sync.
        self.storages: list[weakref.ref] = []
        # Ops recorded in this graph, ever: the one count; the ops pending are those recorded
        # since its last sync (``recorded_ops - synced_ops``), the ops the metrics do not have
        # yet those recorded since the last fold (``- folded_ops``: DeviceContext.fold_metrics
        # in lazytpu.engine).
        self.recorded_ops = 0
        self.synced_ops = 0
        self.folded_ops = 0

    @property
    def rng(self) -> Data | Output | None:
        """The device's PRNG key: a program input and output (Note [Random state])."""
        return self._random.value

    @rng.setter
    def rng(self, value: Data | Output | None) -> None:
        self._random.value = value

    @property
    def pending_ops(self) -> int:
        """The ops recorded since the last sync (the graph cap bounds them)."""
        return self.recorded_ops - self.synced_ops

    def pending_storages(self, prune: bool = False) -> list[Storage]:
        """Live storages that hold pending values now, each once, in order.
        ``prune``: also drop the entries of the others (a flush lists them
        twice, for its roots and to bind its results, then clears them all;
        a repeated entry stays, it says when its storage last became pending)."""
        seen: set[int] = set()
        out, refs = [], []
        for ref in self.pending:
            s = ref()
            if s is not None and type(s.value) is Output:
                if prune:
                    refs.append(ref)
                if id(s) not in seen:
                    seen.add(id(s))
                    out.append(s)
        if prune:
            self.pending = refs
        return out

    def roots(self, prune: bool = False) -> list[Output]:
        """Every pending value a sync must materialize (rng included);
        ``prune``: a flush's (``pending_storages``)."""
        outs = [s.value for s in self.pending_storages(prune)]
        if isinstance(self.rng, Output):
            outs.append(self.rng)
        return outs

    def live_storages(self) -> list[Storage]:
        """Every live storage (and prune the dead references)."""
        alive, refs = [], []
        for ref in self.storages:
            s = ref()
            if s is not None:
                alive.append(s)
                refs.append(ref)
        self.storages = refs
        return alive

    def live_buffers(self) -> list:
        """The device buffers of every live storage (what synchronize waits for)."""
        return [s.value.buffer for s in self.live_storages() if isinstance(s.value, Data)]

    def held_buffers(self) -> set[int]:
        """ids of the device buffers some live storage (or the rng) holds.

        Note [Donation]: a program input that no live storage holds any more
        (a parameter overwritten in place by this very program) is donated to
        the program, so its memory is reused for the outputs; unless another
        lane's pending values still read it (``buffers_read_outside``: a
        thread's pending random op reads the key another thread's flush
        advances, or a buffer another thread overwrote in place).
        """
        held = {id(b) for b in self.live_buffers()}
        if isinstance(self.rng, Data):
            held.add(id(self.rng.buffer))
        return held

    def buffers_read_outside(self, computed) -> set[int]:
        """ids of the device buffers that this graph's pending values read,
        other than the values in ``computed`` (another lane's flush, Note
        [Donation]): those buffers must not be donated, since this graph
        will still read them."""
        seen: set[int] = set()
        held: set[int] = set()
        todo = [root for root in self.roots() if root not in computed]
        while todo:
            node = todo.pop().node
            if id(node) in seen:
                continue
            seen.add(id(node))
            for v in node.inputs:
                if type(v) is Data:
                    held.add(id(v.buffer))
                elif type(v) is Output:
                    todo.append(v)
        return held

    def forget_pending(self) -> None:
        """A sync found nothing pending: drop the stale entries of ``pending``.

        A stale entry would place its storage too early when it next becomes
        pending (Note [Deterministic roots]): the first step after a sync of
        nothing would record its roots in another order than every later
        step, and compile a second program.
        """
        self.pending.clear()
        self.synced_ops = self.recorded_ops

    def settle(self, results: dict[Output, Data], failures: dict[Output, BaseException]) -> list:
        """Re-bind every pending value to its result, or to ``Failed`` with
        the error of the op it depends on (Note [Deferred failures]).

        The PRNG state is lost with a failed value (the key before the failed
        program is not kept): the next draw starts from the seed again.

        Returns:
            ``(storage, the pending value it held, the value bound)`` for each
            storage bound.
        """
        settled = []
        for storage in self.pending_storages():
            value = storage.value
            done = results.get(value)
            storage.value = done if done is not None else Failed(failures[value], value.aval)
            settled.append((storage, value, storage.value))
        self.pending.clear()
        if isinstance(self.rng, Output):
            self.rng = results.get(self.rng)
        self.synced_ops = self.recorded_ops
        return settled

    @staticmethod
    def weakly(settled: list) -> list:
        """``settle``'s result with weak references to the storages and the
        buffers bound: kept until a value check is read, it must not keep them
        alive (Note [Value checks])."""
        return [
            (weakref.ref(s), value, weakref.ref(bound.buffer)) for s, value, bound in settled if type(bound) is Data
        ]

    @staticmethod
    def fail_values(settled: list, failures: dict[Output, BaseException]) -> None:
        """Re-bind the storages that ``settle`` (or ``weakly``) bound from a
        value in ``failures`` to ``Failed`` (a check failed after the program
        ran), unless they have been re-bound since."""
        for storage, value, bound in settled:
            error = failures.get(value)
            if error is None:
                continue
            if type(storage) is weakref.ref:
                storage, buffer = storage(), bound()
                if storage is None or type(storage.value) is not Data or storage.value.buffer is not buffer:
                    continue
            elif storage.value is not bound:
                continue
            storage.value = Failed(error, value.aval)
