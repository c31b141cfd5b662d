"""``torch.utils.checkpoint`` on ``tpu``: recomputation that saves memory in a
fused program.

Note [Recomputation barrier]: non-reentrant activation checkpointing
(``checkpoint(fn, x, use_reentrant=False)``) drops what ``fn`` saves for
backward and, in the backward pass, runs ``fn`` again on its saved inputs.
In defer mode the recomputation is recorded into the same program as what
came before it, and XLA sees the same ops on the same inputs twice: it
merges the recomputation back into the forward pass (CSE), or schedules it
at the start of the backward pass, and every activation is alive at once
again. Measured on an 8-layer MLP (``tests/test_checkpoint_memory.py``):
with checkpointing the peak was the same as without it in one fused program,
and 1.37x as high with step segments (the recomputations of every layer at
the start of the backward's program). So the recomputation's inputs go
through an ordering barrier first (``lazytpu.optimization_barrier``, Note in
lazytpu/lowering/barrier.py): new tensors with the same values, which exist
only after the newest value pending in the lane (the backward's progress
when the recomputation starts) and which XLA cannot merge with the inputs
they came from. Each layer's recomputation then runs when the backward
reaches it, as on CUDA; the peak falls to 0.26x (fused) and 0.33x (step
segments) of the model without checkpointing. PyTorch/XLA does the same with
``optimization_barrier_`` in its own copy of ``checkpoint``; here torch's own
``checkpoint`` is used, and the barrier is put on the inputs it hands to the
recomputation: ``_CheckpointFrame.get_inputs``, wrapped once by
``register`` (with ``save_inputs``, Note [Recomputed random ops], the torch
internals this module touches: torch offers no hook there). Values never change: the barrier is the identity.
Nothing is added in strict mode (each op already runs on its own), when
nothing is pending (the forward has run: nothing to merge with), or for
inputs that are not on ``tpu``. Reentrant checkpointing
(``use_reentrant=True``) recomputes inside its own backward call and is not
covered (its random state is: Note [Recomputed random ops]).
"""

from __future__ import annotations

import functools

import torch.utils.checkpoint as torch_checkpoint

from lazytpu import engine
from lazytpu.frontend.tensor import LazyTensor
from lazytpu.ir import Data, Node, Output, Storage
from lazytpu.ir.node import op_sig
from lazytpu.ir.template import Slot, Template
from lazytpu.lowering.barrier import OPTIMIZATION_BARRIER


def _newest_pending(graph, skip: set):
    """The value of the storage of ``graph`` that became pending last (not in
    ``skip``, and not empty: the barrier reads one element of it), or None."""
    for ref in reversed(graph.pending):
        storage = ref()
        if storage is None or id(storage) in skip or type(storage.value) is not Output:
            continue
        if storage.numel:
            return storage.value
    return None


def ordered_copies(tensors: list) -> list:
    """``tensors`` with each ``tpu`` tensor replaced by one with the same
    value, window and ``requires_grad``, computed after the newest pending
    value of its lane and not mergeable with its source (Note
    [Recomputation barrier]); the others as they are. Tensors that share a
    storage share the new one."""
    if engine.MODE.current is not engine.EagerMode.DEFER_AND_FUSE:
        return tensors
    by_graph: dict[int, dict[int, Storage]] = {}
    for t in tensors:
        if isinstance(t, LazyTensor) and type(t._lt_storage.value) in (Data, Output):
            storage = t._lt_storage
            by_graph.setdefault(id(storage.graph), {})[id(storage)] = storage
    replaced: dict[int, Storage] = {}
    for storages in by_graph.values():
        graph = next(iter(storages.values())).graph
        with graph.lock:
            tie = _newest_pending(graph, set(storages))
            if tie is None:  # nothing pending: nothing to merge with or to wait for
                continue
            sources = list(storages.values())
            values = tuple(s.value for s in sources)
            avals = tuple(v.aval for v in values)
            spec = Template(tuple(Slot(i) for i in range(len(values) + 1)), (("tied", True),))
            node = Node(
                OPTIMIZATION_BARRIER, spec, (*values, tie), avals, None, op_sig(OPTIMIZATION_BARRIER, spec, avals)
            )
            for i, source in enumerate(sources):
                replaced[id(source)] = Storage(Output(node, i), graph, source.stride)
    if not replaced:
        return tensors
    out = []
    for t in tensors:
        storage = replaced.get(id(t._lt_storage)) if isinstance(t, LazyTensor) else None
        if storage is None:
            out.append(t)
            continue
        copy = LazyTensor(storage, t._lt_desc)
        out.append(copy.requires_grad_() if t.requires_grad else copy)
    return out


# Note [Recomputed random ops]: torch's checkpoint gives the recomputation the
# random state the forward had only for devices whose module has
# ``_initialized`` and a ``device`` context (CUDA's protocol), reading it to
# the host (``get_rng_state``) at every checkpointed forward; ``torch.tpu`` has
# neither, so a dropout inside a checkpoint drew a new mask in the backward,
# and the gradients were those of another mask than the forward's. Instead the
# device's random state itself (the value of its key, pending or computed:
# Note [Random state] in lazytpu.ir.graph) is kept when the forward saves its
# inputs (``save_inputs``), put back for the recomputation and restored after
# it, with no host read and no sync: the recomputation draws what the forward
# drew, and what follows draws as if it had not run. The state of every tpu
# device used so far is kept, as CPU's is whatever the inputs (torch's CUDA
# protocol keeps only the devices of the positional inputs: a tensor in a list
# or a keyword argument drew a new mask); none with ``preserve_rng_state=False``,
# whose recomputation draws anew, as on CPU. Reentrant checkpointing
# (``CheckpointFunction``) alike: its forward keeps the state its inputs'
# devices had before it ran, for the ``run_function`` its backward runs again.
# A kept state is held by a storage of its own, as a tensor's value is: a sync
# between the forward and the recomputation (the step's segments, a read)
# computes it if pending and does not donate its buffer to the program that
# advances the key (Note [Donation]); kept as a bare value, it was deleted
# there ("Array has been deleted"), or left a node of a program already run.


def _held_states(indices) -> dict:
    """The random state of each device of ``indices``, each held by a storage."""
    states = {}
    for index in indices:
        ctx = engine.context(index)
        with ctx.lock:
            states[index] = Storage(ctx.rng_value(), ctx.graph, (1,))
    return states


def _random_states() -> dict:
    """The random state of each ``tpu`` device used so far: the inputs' devices
    wherever they lie (a list, a dict, a keyword argument) and any other, as
    CPU's state is kept whatever the inputs are."""
    return _held_states(sorted(ctx.index for ctx in engine.contexts()))


def _preserves_rng_state(recompute_fn) -> bool:
    """``preserve_rng_state`` of a non-reentrant checkpoint, which only its
    ``recompute_fn``'s closure holds (True where it cannot be read)."""
    names = getattr(getattr(recompute_fn, "__code__", None), "co_freevars", ())
    if "preserve_rng_state" not in names:
        return True
    return bool(recompute_fn.__closure__[names.index("preserve_rng_state")].cell_contents)


def _set_random_states(states: dict) -> None:
    for index, held in states.items():
        ctx = engine.context(index)
        with ctx.lock:
            ctx.random.value = held.value


def _with_forward_random_state(recompute_fn, states: dict):
    """``recompute_fn`` run with the forward's random ``states`` (Note [Recomputed random ops])."""

    @functools.wraps(recompute_fn)
    def recompute(*args):
        after = _held_states(states)
        _set_random_states(states)
        try:
            return recompute_fn(*args)
        finally:
            _set_random_states(after)

    return recompute


def _saving_random_state(save_inputs):
    """``_CheckpointFrame.save_inputs``, also keeping the random state for the recomputation."""

    @functools.wraps(save_inputs)
    def wrapper(frame, *args):
        save_inputs(frame, *args)
        states = _random_states() if _preserves_rng_state(frame.recompute_fn) else None
        if states:
            frame.recompute_fn = _with_forward_random_state(frame.recompute_fn, states)

    wrapper.lazytpu_wrapped = True
    return wrapper


def _reentrant_saving_random_state(forward):
    """``CheckpointFunction.forward``, also keeping the random state for its backward's recomputation."""

    @functools.wraps(forward)
    def wrapper(ctx, run_function, preserve_rng_state, *args):
        states = _random_states() if preserve_rng_state else None
        out = forward(ctx, run_function, preserve_rng_state, *args)
        if states:
            ctx.run_function = _with_forward_random_state(ctx.run_function, states)
        return out

    wrapper.lazytpu_wrapped = True
    return wrapper


def _ordered_inputs(get_inputs):
    """``_CheckpointFrame.get_inputs``, its tensors through the barrier."""

    @functools.wraps(get_inputs)
    def wrapper(frame):
        return ordered_copies(get_inputs(frame))

    wrapper.lazytpu_wrapped = True
    return wrapper


def register() -> None:
    """Idempotent: the barrier on the inputs of non-reentrant checkpointing's
    recomputation (Note [Recomputation barrier]) and the forward's random
    state for it, and for reentrant checkpointing's (Note [Recomputed random ops])."""
    frame = torch_checkpoint._CheckpointFrame
    if not getattr(frame.get_inputs, "lazytpu_wrapped", False):
        frame.get_inputs = _ordered_inputs(frame.get_inputs)
    if not getattr(frame.save_inputs, "lazytpu_wrapped", False):
        frame.save_inputs = _saving_random_state(frame.save_inputs)
    reentrant = torch_checkpoint.CheckpointFunction
    if not getattr(reentrant.forward, "lazytpu_wrapped", False):
        reentrant.forward = staticmethod(_reentrant_saving_random_state(reentrant.forward))
