"""Collectives recorded into the pending program (in-graph XLA collectives).

Note [In-graph collectives]: a collective of the whole world on ``tpu``
tensors is not a sync of its own. It is recorded like any op (one IR node,
``COLLECTIVE``, whose rule is the ``collectives`` rule of the same name), and
the device's next flush lowers the whole pending program inside one
``shard_map`` over the world's mesh (one device per process) and runs it as
one multi-process XLA program: a DDP step's forward, backward, gradient
all-reduce and optimizer update compile into one program per step.

Every program input and output is declared replicated (``P()``) over the
mesh, but each process passes and reads its own device's values: inside
``shard_map`` (manual sharding) nothing is moved between devices except by the
collectives themselves, so a "replicated" value is simply each process's own.
This costs no reshapes and no copies: a local buffer becomes the global
array's one addressable shard, and a result's local shard is the value.

As with any SPMD program, every rank of the group must run the collectives in
the same order; a rank whose program holds a collective waits in it for the
others. Ranks that reach different sync points (rank 0 reads ``loss.item()``
in the middle of a step, the others do not) run differently cut programs
holding the same collectives in the same order: that works on XLA:CPU with
gloo (tested), but on TPU keep sync points identical on every rank.
"""

from __future__ import annotations

import functools
import time
import warnings

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lazytpu import _caches, metrics
from lazytpu.distributed import collectives
from lazytpu.engine import context
from lazytpu.frontend.tensor import LazyTensor
from lazytpu.frontend.windows import read, write_value
from lazytpu.ir import Aval, Node, Output
from lazytpu.ir.template import Slot, Template
from lazytpu.lowering.registry import lowering
from lazytpu.runtime import executor, memory

COLLECTIVE = "lazytpu.collective"


@lowering(COLLECTIVE)
def _collective(x, *, name: str, shapes: tuple, flatten: bool = False, **static):
    """The rule of an in-graph collective: ``collectives`` rule ``name`` on
    ``x`` (at least 1-d, flattened when asked), results shaped ``shapes``."""
    if flatten or x.ndim == 0:
        x = x.reshape(-1)
    out = collectives.RULES[name](x, **static)
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(o.reshape(s) for o, s in zip(outs, shapes))


def record(name: str, mesh, source: LazyTensor, outputs: list[LazyTensor], **static) -> None:
    """Record collective ``name`` of ``source`` over ``mesh``; its results become
    the values of ``outputs`` (an in-place write, seen by their views).

    The device's next flush runs over ``mesh`` (Note [In-graph collectives]).
    """
    index = source.device.index or 0
    ctx = context(index)
    with ctx.graph.lock:
        value = read(source)
        kwargs = (("name", name), ("shapes", tuple(tuple(o.shape) for o in outputs)), *sorted(static.items()))
        avals = tuple(Aval(tuple(o.shape), o.dtype) for o in outputs)
        node = Node(COLLECTIVE, Template((Slot(0),), kwargs), (value,), avals)
        # Before anything can flush (strict mode, the graph cap, a view's write):
        # the program holding the node must run over the mesh.
        ctx.collective_runner = _runner(mesh)
        for i, out in enumerate(outputs):
            write_value(out, Output(node, i))
        ctx.recorded(node)


# -- running programs over a mesh ---------------------------------------------------------


@functools.cache
def _runner(mesh):
    return functools.partial(execute, mesh=mesh)


_caches.register("distributed_ingraph_runners", _runner.cache_clear)


def _compile(fn, args, mesh, donate: tuple, on_compile):
    start = time.perf_counter()
    body = jax.shard_map(fn, mesh=mesh, in_specs=tuple(P() for _ in args), out_specs=P(), check_vma=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        lowered = jax.jit(body, donate_argnums=donate).lower(*args)
    if on_compile is not None:
        on_compile(lowered)
    compiled = lowered.compile()
    metrics.add("compile_seconds", time.perf_counter() - start)
    metrics.add("programs_compiled")
    return compiled


def execute(key, make_fn, inputs: list, *, mesh, index: int = 0, blocking: bool = False, donate=(), on_compile=None):
    """``runtime.execute`` for a program holding collectives: the same
    contract (this process's input buffers in, its output buffers out), run
    as one SPMD program over ``mesh``."""
    sharding = NamedSharding(mesh, P())
    args = [
        jax.make_array_from_single_device_arrays(a.shape, sharding, [a]) if isinstance(a, jax.Array) else a
        for a in inputs
    ]
    outs = executor.run_program(
        (key, mesh), lambda: _compile(make_fn(), args, mesh, tuple(donate), on_compile), args, blocking
    )
    local = tuple(o.addressable_data(0) for o in outs)
    memory.of(index).track(local)  # this process's buffers (not the program's temporaries: Note [Device memory])
    return local
