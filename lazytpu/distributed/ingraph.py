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

Note [Subgroups in the world mesh]: a collective of a ``DeviceMesh``
dimension's group (a row or a column of a 2-D mesh) is in-graph too. Every
rank runs the program, each over its own group, which SPMD expresses by
cutting the world into a mesh of several axes: a group of ranks
``base + stride * i`` (``i < size``) spans the axes between strides
``stride`` and ``stride * size`` of a row-major mesh cut there
(``jax_runtime.world_mesh``), and its collective is the ``jax.lax``
collective over those axes (``jax_runtime.group_axes``; the axes are read
from the mesh the program is traced under). A program holding collectives of
several groups (FSDP's over ``dp``, TP's over ``tp``) runs over the mesh cut
at all their strides; a group whose cuts cannot join the pending program's
(one cut not dividing the next) first flushes it. Only ``DeviceMesh`` groups
qualify (torch names them ``mesh_<dim>``): a subgroup made by ``new_group``
may be used by its members alone, while a world program needs every rank, so
it runs each collective as a program of its own, as does a group whose ranks
are not evenly strided (``jax_runtime.line``). This assumes the
``DeviceMesh`` spans the world, as one from ``init_device_mesh`` does when
its shape multiplies to the world size: the ranks outside a smaller mesh
(``init_device_mesh("tpu", (2,))`` in a world of 4) never run its program,
and its members wait for them. A group cannot tell (torch creates a mesh's
groups without a barrier, so no rank can check the others' in time); build
such a mesh's groups with ``new_group`` instead.
"""

from __future__ import annotations

import time
import warnings

import attrs
import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lazytpu import metrics
from lazytpu.distributed import collectives, jax_runtime
from lazytpu.engine import context
from lazytpu.frontend.tensor import LazyTensor
from lazytpu.frontend.windows import read, write_value
from lazytpu.ir import Aval, Node, Output
from lazytpu.ir.template import Slot, Template
from lazytpu.lowering.registry import lowering
from lazytpu.runtime import executor, memory, persistent

COLLECTIVE = "lazytpu.collective"


@lowering(COLLECTIVE)
def _collective(x, *, name: str, shapes: tuple, group: tuple, after=None, flatten: bool = False, **static):
    """The rule of an in-graph collective: ``collectives`` rule ``name`` on
    ``x`` (at least 1-d, flattened when asked) over the world mesh's axes of
    ``group`` (Note [Subgroups in the world mesh]), results shaped ``shapes``;
    not before ``after``, the program's previous collective's result (Note
    [Collective order])."""
    if after is not None and after.size:
        x = _after(x, after)
    if flatten or x.ndim == 0:
        x = x.reshape(-1)
    mesh = jax.sharding.get_abstract_mesh()
    axis = jax_runtime.group_axes(mesh.axis_names, mesh.axis_sizes, group)
    out = collectives.RULES[name](x, axis=axis, **static)
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(o.reshape(s) for o, s in zip(outs, shapes))


# Note [Collective order]: the ranks of a job run the same collectives in the
# same order, but not always the same program: an uneven shard makes one
# rank's local shapes differ from another's (DTensor pads only what it sends),
# and XLA schedules two independent collectives of a program either way,
# differently in differently shaped programs. Collectives match by order
# (gloo on CPU: a mismatch is "Received data size doesn't match expected
# size"), so each in-graph collective's input depends on the result of the
# one recorded before it in the same program: the program runs them in record
# order, on every rank alike. The dependency must be one XLA cannot fold away
# (it drops an ``optimization_barrier`` on CPU, and folds a select between
# equal branches): ``_after`` selects ``x`` unless the first element's bits
# OR 1 are zero, which they never are; the select fuses into ``x``'s producer.


def _after(x, after):
    """``x``, computed after ``after`` (Note [Collective order])."""
    bits = collectives.to_bits(after.reshape(-1)[:1]).reshape(-1)[0]
    never = (bits | 1) == 0
    return jax.numpy.where(never, jax.numpy.zeros_like(x), x)


def record(name: str, group: tuple[int, int], source: LazyTensor, outputs: list[LazyTensor], **static) -> None:
    """Record collective ``name`` of ``source`` over ``group`` (``(stride, size)``
    in the world's ranks, Note [Subgroups in the world mesh]); its results
    become the values of ``outputs`` (an in-place write, seen by their views).

    The device's next flush runs over the world (Note [In-graph collectives]).
    """
    index = source.device.index or 0
    ctx = context(index)
    pending = ctx.collective_runner
    if not isinstance(pending, WorldRunner):
        pending = None
    world = jax.process_count()
    cuts = jax_runtime.merge_cuts(pending.cuts if pending else (), group, world)
    if cuts is None:  # no one mesh holds both: the pending program runs first
        ctx.flush("collective")
        pending, cuts = None, jax_runtime.merge_cuts((), group, world)
    with ctx.graph.lock:
        values = (read(source),) if pending is None else (read(source), pending.last)
        kwargs = [
            ("name", name),
            ("shapes", tuple(tuple(o.shape) for o in outputs)),
            ("group", group),
            *static.items(),
        ]
        if pending is not None:
            kwargs.append(("after", Slot(1)))
        avals = tuple(Aval(tuple(o.shape), o.dtype) for o in outputs)
        node = Node(COLLECTIVE, Template((Slot(0),), tuple(sorted(kwargs))), values, avals)
        # Before anything can flush (strict mode, the graph cap, a view's write):
        # the program holding the node must run over the world's mesh.
        ctx.collective_runner = WorldRunner(jax_runtime.world_mesh(cuts, index), cuts, Output(node, 0))
        for i, out in enumerate(outputs):
            write_value(out, Output(node, i))
        ctx.recorded(node)


# -- running programs over a mesh ---------------------------------------------------------


@attrs.frozen(slots=True)
class WorldRunner:
    """The runner of a pending program holding in-graph collectives: it runs
    over ``mesh`` (the world cut at ``cuts``); ``last`` is the result of the
    program's last collective (Note [Collective order])."""

    mesh: jax.sharding.Mesh
    cuts: tuple[int, ...]
    last: Output

    @property
    def effects(self) -> tuple[Output, ...]:
        """The last collective, computed even if no tensor holds it (Note [Runner
        effects] in lazytpu.engine); each collective depends on the one before."""
        return (self.last,)

    def __call__(self, key, make_fn, inputs: list, **kwargs):
        return execute(key, make_fn, inputs, mesh=self.mesh, **kwargs)


def _compile(fn, args, mesh, donate: tuple, on_compile):
    start = time.perf_counter()
    body = jax.shard_map(fn, mesh=mesh, in_specs=tuple(P() for _ in args), out_specs=P(), check_vma=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        lowered = jax.jit(body, donate_argnums=donate).lower(*args)
    if on_compile is not None:
        on_compile(lowered)
    compiled = persistent.compile_program(lowered)  # Note [Rounding per op]
    metrics.add("compile_seconds", time.perf_counter() - start)
    metrics.add("programs_compiled")
    return compiled


def execute(
    key, make_fn, inputs: list, *, mesh, cuts=(), index: int = 0, blocking: bool = False, donate=(), on_compile=None
):
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
    counts = memory.of(index)  # this process's buffers (not the program's temporaries: Note [Device memory])
    counts.release(inputs[i] for i in donate)
    counts.track(local)
    return local
