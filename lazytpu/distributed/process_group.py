"""``ProcessGroupTPU``: torch.distributed's process group for ``tpu`` tensors.

Each collective materializes its input tensors (a flush of their device's
pending program), runs one XLA collective program over the group's mesh of
processes (``collectives.run``) and binds the results into the output tensors
in place. Nothing waits for the device: as with NCCL streams, the results are
queued device values, and whatever reads them later waits for them.

Note [CPU tensors in a tpu_dist group]: torch only lets a Python process group
stand for the whole group, so in ``backend="cpu:gloo,tpu:tpu_dist"`` this
class also receives the CPU tensors. It hands them to a gloo process group of
its own (created with the group, on the same store).
"""

from __future__ import annotations

import datetime

import jax
import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as c10d
from torch._C._distributed_c10d import _create_work_from_future

from lazytpu.distributed import collectives, ingraph, jax_runtime
from lazytpu.engine import context, contexts
from lazytpu.frontend.tensor import LazyTensor, contiguous_strides
from lazytpu.frontend.windows import new_tensor, write_value
from lazytpu.ir import Data, Failed, Output

BACKEND = "tpu_dist"

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.PRODUCT: "product",
    dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
}


def _op_name(reduce_op) -> str:
    op = getattr(reduce_op, "op", reduce_op)
    name = _OPS.get(op)
    if name is None:
        raise ValueError(f"lazytpu tpu_dist: reduce op {reduce_op} is not supported")
    return name


# -- tensors <-> device arrays --------------------------------------------------------


def device_arrays(tensors) -> list[jax.Array]:
    """The current values of tpu ``tensors`` as device arrays of their shapes
    (flushing their devices' pending programs when needed)."""
    with torch.no_grad():
        bases = [t if not t._lt_windowed else t.clone(memory_format=torch.contiguous_format) for t in tensors]
    for t in bases:
        if isinstance(t._lt_storage.value, Output):  # its lane's program (Note [Lanes])
            ctx = context(t.device.index or 0)
            ctx.flush("collective", lane=ctx.lane_of(t._lt_storage))
    arrays = []
    for t in bases:
        value = t._lt_storage.value
        if isinstance(value, Failed):
            raise RuntimeError(f"lazytpu: a collective's input could not be computed: {value.error}")
        arrays.append(value.buffer)
    return arrays


def bind_result(t: LazyTensor, array: jax.Array) -> None:
    """Make ``t`` hold ``array`` (an in-place write, seen by its views)."""
    if array.shape != tuple(t.shape):
        array = array.reshape(t.shape)
    write_value(t, Data(array, t._lt_desc.aval))
    base = t._base
    if base is not None and base.is_complex() and not t.is_complex() and base._lt_storage is not t._lt_storage:
        # Note [view_as_real]: torch.distributed hands complex tensors to the
        # group as ``view_as_real`` views, and a tpu ``view_as_real`` does not
        # share its base's storage: the result is written to the base too.
        bind_result(base, jax.lax.complex(array[..., 0], array[..., 1]))


def _done(result) -> dist.Work:
    future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


def _device_index(tensors) -> int:
    indices = {t.device.index or 0 for t in tensors}
    if len(indices) != 1:
        raise ValueError(f"lazytpu tpu_dist: a collective's tensors must be on one device, got {sorted(indices)}")
    return indices.pop()


def _on_cpu(tensors) -> bool:
    """Whether this call is for the CPU helper group (all tensors on CPU)."""
    kinds = {type(t) is LazyTensor for t in tensors}
    if len(kinds) > 1:
        raise ValueError("lazytpu tpu_dist: a collective cannot mix tpu and cpu tensors")
    return kinds == {False}


class ProcessGroupTPU(dist.ProcessGroup):
    """A process group whose collectives are XLA collectives over JAX's
    multi-process runtime (Note [One JAX runtime per process]).

    Created by ``init_process_group(backend="tpu_dist")`` (or ``"tpu"``), not
    directly.
    """

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, ranks: tuple[int, ...]):
        super().__init__(rank, size)
        self._rank, self._size, self._ranks = rank, size, ranks
        self._timeout = timeout
        self._world: tuple | None = None  # in-graph (stride, size), () when not (known at first use)
        self._group_name = self._group_desc = ""
        self._cpu_group = dist.ProcessGroupGloo(dist.PrefixStore("lazytpu_gloo/", store), rank, size, timeout)

    def getBackendName(self) -> str:
        return BACKEND

    @property
    def _gloo(self) -> dist.ProcessGroupGloo:
        """The gloo group of the CPU tensors (Note [CPU tensors in a tpu_dist group]), after the
        pending in-graph collectives have run (Note [Device collectives before host ones])."""
        run_pending_collectives()
        return self._cpu_group

    @property
    def _device_types(self) -> list[torch.device]:
        # torch reads the devices a group serves from the backends registered on it, none for a
        # group that is its own backend; this one serves tpu and, through its gloo helper, cpu
        # tensors (dcp.async_save requires cpu; broadcast_from_rank0 picks the tensors' device).
        return [torch.device("cpu"), torch.device("tpu")]

    # torch keeps a group's name and description on its backends; this group
    # has none, so it keeps them itself (functional collectives look groups up
    # by name).
    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def name(self) -> str:
        return BACKEND

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"ProcessGroupTPU(rank={self._rank}, size={self._size}, ranks={list(self._ranks)})"

    # -- helpers ------------------------------------------------------------
    def _run(self, name: str, inputs, **static) -> list[jax.Array]:
        index = _device_index(inputs)
        return collectives.run(name, jax_runtime.mesh(self._ranks, index), device_arrays(inputs), **static)

    def _in_graph(self) -> tuple[int, int] | None:
        """``(stride, size)`` of this group in the world's ranks when its
        collectives are recorded into the pending program: the whole world,
        or a ``DeviceMesh`` dimension's evenly strided group (Note [Subgroups
        in the world mesh] in lazytpu.distributed.ingraph); else ``None``."""
        if self._world is None:
            world = jax.process_count()
            if self._ranks == tuple(range(world)):
                self._world = (1, world)
            elif self._group_desc.startswith("mesh_"):
                self._world = jax_runtime.line(self._ranks, world) or ()
            else:
                self._world = ()
        return self._world or None

    def _apply(self, name: str, source, outputs, **static) -> None:
        """Collective ``name`` of ``source``, its results written to ``outputs``:
        recorded into the pending program when the group allows it (Note
        [In-graph collectives]), else run now as a program of its own."""
        index = _device_index([source, *outputs])
        group = self._in_graph()
        if group is not None and not any(_complex_view(t) for t in (source, *outputs)):
            ingraph.record(name, group, source, list(outputs), **static)
            return
        flatten = static.pop("flatten", False)
        (array,) = device_arrays([source])
        if flatten or array.ndim == 0:
            array = array.reshape(-1)
        results = collectives.run(name, jax_runtime.mesh(self._ranks, index), [array], **static)
        for out, result in zip(outputs, results):
            bind_result(out, result)

    # -- all-reduce -------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts or c10d.AllreduceOptions()
        if _on_cpu(tensors):
            return self._gloo.allreduce(tensors, opts)
        op = _op_name(opts.reduceOp)
        for t in tensors:
            self._apply("all_reduce", t, [t], op=op, size=self._size)
        return _done(list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or c10d.AllreduceCoalescedOptions()
        if _on_cpu(tensors):
            return self._gloo.allreduce_coalesced(tensors, opts)
        return self.allreduce(tensors, _as_allreduce(opts))

    def reduce(self, tensors, opts=None):
        opts = opts or c10d.ReduceOptions()
        if _on_cpu(tensors):
            return self._gloo.reduce(tensors, opts)
        op = _op_name(opts.reduceOp)
        for t in tensors:
            (out,) = self._run("all_reduce", [t], op=op, size=self._size)
            if self._rank == opts.rootRank:
                bind_result(t, out)
        return _done(list(tensors))

    # -- broadcast / scatter ------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        opts = opts or c10d.BroadcastOptions()
        if _on_cpu(tensors):
            return self._gloo.broadcast(tensors, opts)
        for t in tensors:
            self._apply("broadcast", t, [t], root=opts.rootRank)
        return _done(list(tensors))

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or c10d.ScatterOptions()
        flat_in = [t for ts in input_tensors for t in ts]
        if _on_cpu(list(output_tensors) + flat_in):
            return self._gloo.scatter(output_tensors, input_tensors, opts)
        (out,) = output_tensors
        if self._rank == opts.rootRank:
            stacked = torch.cat([t.reshape(1, *out.shape) for t in input_tensors[0]])
        else:
            stacked = out.new_zeros((self._size, *out.shape))
        (result,) = self._run("scatter", [stacked], root=opts.rootRank)
        bind_result(out, result)
        return _done(list(output_tensors))

    # -- gathers ----------------------------------------------------------------
    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or c10d.AllgatherOptions()
        if _on_cpu(list(input_tensors) + [t for ts in output_tensors for t in ts]):
            return self._gloo.allgather(output_tensors, input_tensors, opts)
        for outs, t in zip(output_tensors, input_tensors):
            _check_list(outs, self._size, "allgather")
            self._apply("all_gather_list", t, outs, size=self._size)
        return _done(output_tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        opts = opts or c10d.AllgatherOptions()
        if _on_cpu(list(input_list) + [t for ts in output_lists for t in ts]):
            return self._gloo.allgather_coalesced(output_lists, input_list, opts)
        for outs, t in zip(output_lists, input_list):
            _check_list(outs, self._size, "allgather_coalesced")
            self._apply("all_gather_list", t, outs, size=self._size)
        return _done(output_lists)

    def all_gather_single(self, output, input, opts=None):
        opts = opts or c10d.AllgatherOptions()
        if _on_cpu([output, input]):
            return self._gloo._allgather_base(output, input, opts)
        if output.numel() != input.numel() * self._size:
            raise ValueError(
                f"all_gather_into_tensor: output has {output.numel()} elements, expected {self._size} x {input.numel()}"
            )
        self._apply("all_gather", input, [output], out_shape=_at_least_1d(output.shape))
        return _done([output])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self.all_gather_single(output, input, opts)
        return _done(list(outputs))

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or c10d.GatherOptions()
        flat_out = [t for ts in output_tensors for t in ts]
        if _on_cpu(list(input_tensors) + flat_out):
            return self._gloo.gather(output_tensors, input_tensors, opts)
        (t,) = input_tensors
        results = self._run("all_gather_list", [t], size=self._size)
        if self._rank == opts.rootRank:
            _check_list(output_tensors[0], self._size, "gather")
            for out, result in zip(output_tensors[0], results):
                bind_result(out, result)
        return _done(output_tensors)

    # -- reduce-scatter -----------------------------------------------------------
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or c10d.ReduceScatterOptions()
        if _on_cpu(list(output_tensors) + [t for ts in input_tensors for t in ts]):
            return self._gloo.reduce_scatter(output_tensors, input_tensors, opts)
        op = _op_name(opts.reduceOp)
        for out, ins in zip(output_tensors, input_tensors):
            _check_list(ins, self._size, "reduce_scatter")
            stacked = torch.cat([t.reshape(1, *out.shape) for t in ins])
            self._apply("reduce_scatter", stacked, [out], op=op, size=self._size)
        return _done(list(output_tensors))

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or c10d.ReduceScatterOptions()
        if _on_cpu([output, input]):
            return self._gloo._reduce_scatter_base(output, input, opts)
        if input.numel() != output.numel() * self._size:
            raise ValueError(
                f"reduce_scatter_tensor: input has {input.numel()} elements, expected {self._size} x {output.numel()}"
            )
        flatten = input.dim() == 0 or input.shape[0] != self._size * (output.shape[0] if output.dim() else 1)
        self._apply("reduce_scatter", input, [output], op=_op_name(opts.reduceOp), size=self._size, flatten=flatten)
        return _done([output])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        for output, input in zip(outputs, inputs):
            self.reduce_scatter_single(output, input, opts)
        return _done(list(outputs))

    # -- all-to-all -------------------------------------------------------------------
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts or c10d.AllToAllOptions()
        if _on_cpu([output, input]):
            return self._gloo.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)
        if not output_split_sizes and not input_split_sizes:
            if input.shape[0] % self._size:
                raise ValueError(f"all_to_all_single: dim 0 ({input.shape[0]}) is not divisible by {self._size}")
            self._apply("all_to_all", input, [output])
            return _done([output])
        return self._all_to_all_uneven(output, input, list(output_split_sizes), list(input_split_sizes))

    def _all_to_all_uneven(self, output, input, out_splits, in_splits):
        n = self._size
        in_splits = in_splits or [input.shape[0] // n] * n
        out_splits = out_splits or [output.shape[0] // n] * n
        # Blocks are padded to the largest block of any rank (agreed on first),
        # so every rank runs the same equal-split program.
        local_max = torch.tensor([max(in_splits + out_splits)], device=input.device)
        self.allreduce([local_max], _allreduce_opts(dist.ReduceOp.MAX))
        block = int(local_max.item())
        rest = tuple(input.shape[1:])
        padded = input.new_zeros((n * block, *rest))
        offset = 0
        for i, size in enumerate(in_splits):
            padded[i * block : i * block + size] = input[offset : offset + size]
            offset += size
        (result,) = self._run("all_to_all", [padded])
        received = _wrap(result, padded)
        pieces = [received[i * block : i * block + size] for i, size in enumerate(out_splits)]
        output.copy_(torch.cat(pieces) if pieces else received[:0])
        return _done([output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or c10d.AllToAllOptions()
        if _on_cpu(list(output_tensors) + list(input_tensors)):
            return self._gloo.alltoall(output_tensors, input_tensors, opts)
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        flat_out = torch.cat([t.reshape(-1) for t in output_tensors])
        self._all_to_all_uneven(
            flat_out, flat_in, [t.numel() for t in output_tensors], [t.numel() for t in input_tensors]
        )
        offset = 0
        for t in output_tensors:
            t.copy_(flat_out[offset : offset + t.numel()].reshape(t.shape))
            offset += t.numel()
        return _done(list(output_tensors))

    # -- point to point ---------------------------------------------------------------
    def send(self, tensors, dst: int, tag: int = 0):
        (t,) = tensors
        if _on_cpu(tensors):
            return self._gloo.send(tensors, dst, tag)
        self._permute(t, self._rank, dst)
        return _done(list(tensors))

    def recv(self, tensors, src: int, tag: int = 0):
        (t,) = tensors
        if _on_cpu(tensors):
            return self._gloo.recv(tensors, src, tag)
        bind_result(t, self._permute(t, src, self._rank))
        return _done(list(tensors))

    def _permute(self, t, src: int, dst: int) -> jax.Array:
        """One XLA program on the two processes ``src`` and ``dst`` (group
        ranks) moving ``src``'s ``t`` to ``dst``."""
        if src == dst:
            raise ValueError(f"lazytpu tpu_dist: send/recv of rank {src} to itself")
        mesh = jax_runtime.mesh((self._ranks[src], self._ranks[dst]), _device_index([t]))
        (out,) = collectives.run("permute", mesh, device_arrays([t]), pairs=((0, 1),))
        return out

    # -- barrier ----------------------------------------------------------------------
    def barrier(self, opts=None):
        run_pending_collectives()
        index = torch.tpu.current_device()
        token = jax.device_put(jax.numpy.zeros((1,), jax.numpy.int32), jax_runtime.platform.device(index))
        (out,) = collectives.run("all_reduce", jax_runtime.mesh(self._ranks, index), [token], op="sum", size=self._size)
        out.block_until_ready()
        return _done([])

    # Older names that torch's Python layer or C++ callers may still use.
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single


def run_pending_collectives() -> None:
    """Run the programs of this process that hold in-graph collectives.

    Note [Device collectives before host ones]: a rank's in-graph collectives
    run when its program does, at its next sync; a host-side collective (a CPU
    tensor's, through gloo) or a barrier runs at once. Were a rank to enter one
    with device collectives still pending, while another rank's program waits
    in those collectives, each would wait for the other: so they run first,
    in the order every rank recorded them (Note [Runner effects] in
    lazytpu.engine keeps them even if their results were dropped).
    """
    for ctx in contexts():
        for lane in list(ctx.lanes.values()):
            if isinstance(lane.collective_runner, ingraph.WorldRunner):
                ctx.flush("collective", lane=lane)


def _complex_view(t: LazyTensor) -> bool:
    """A real view of a complex tensor (Note [view_as_real]): written back eagerly."""
    base = t._base
    return base is not None and base.is_complex() and not t.is_complex()


def _wrap(array: jax.Array, like: LazyTensor) -> LazyTensor:
    """A new tpu tensor holding ``array`` (of ``like``'s shape and dtype)."""
    return new_tensor(
        Data(array, like._lt_desc.aval),
        tuple(like.shape),
        contiguous_strides(like.shape),
        like.dtype,
        like.device.index or 0,
    )


def _at_least_1d(shape) -> tuple[int, ...]:
    return tuple(shape) if len(shape) else (1,)


def _check_list(tensors, size: int, what: str) -> None:
    if len(tensors) != size:
        raise ValueError(f"{what}: expected a list of {size} tensors (the group size), got {len(tensors)}")


def _allreduce_opts(op) -> c10d.AllreduceOptions:
    opts = c10d.AllreduceOptions()
    opts.reduceOp = op
    return opts


def _as_allreduce(opts) -> c10d.AllreduceOptions:
    return _allreduce_opts(opts.reduceOp)
