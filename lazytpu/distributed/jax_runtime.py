"""JAX's multi-process runtime for ``torch.distributed``: start it once, name
each process's devices, build the meshes collectives run over.

Note [One JAX runtime per process]: collectives are XLA collectives over
``jax.distributed`` (the TPU interconnect, NCCL on GPU, gloo on CPU); lazytpu
has no transport of its own. ``jax.distributed.initialize`` must run before
JAX creates its devices, so ``init_process_group(backend="tpu_dist")`` must
come before the first ``tpu`` tensor. Rank 0 picks a free port on its own
address (``MASTER_ADDR``), binds the coordinator there (never a wildcard
address) and publishes ``host:port`` in torch's rendezvous store; every rank
then joins with its torch rank as JAX process id.
"""

from __future__ import annotations

import datetime
import functools
import os
import socket
import threading

import attrs
import jax
import numpy as np

from lazytpu import _caches, _config
from lazytpu.runtime import platform

_COORDINATOR_KEY = "lazytpu/jax_coordinator"


@attrs.define(slots=True)
class JaxOptions:
    """Settings of ``jax.distributed.initialize`` (read when it runs).

    Attributes:
        heartbeat_timeout_s: a process silent this long is declared dead and
            every other process stops with an error.
        shutdown_timeout_s: how long a process leaving waits for the others.
        initialization_timeout_s: connecting to the coordinator gives up after
            this long (default: the process group's ``timeout``).
        coordinator_address: ``host:port`` to use instead of a free port on
            ``MASTER_ADDR`` (the coordinator binds exactly this address).
        local_device_ids: the local devices this process uses (default: all;
            e.g. ``[local_rank]`` for one process per chip on a multi-chip host).
    """

    heartbeat_timeout_s: int = 100
    shutdown_timeout_s: int = 300
    initialization_timeout_s: int | None = None
    coordinator_address: str | None = None
    local_device_ids: list[int] | None = None


class _Runtime:
    """The process's one JAX multi-process runtime (Note [One JAX runtime per process])."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.options = JaxOptions()
        self.world_size: int | None = None  # None: not started by us
        self.coordinator_address: str | None = None  # where JAX's coordinator is (when we started it)


RUNTIME = _Runtime()


def options() -> JaxOptions:
    """The settings the next ``jax.distributed.initialize`` uses (mutable)."""
    return RUNTIME.options


def _jax_distributed_started() -> bool:
    from jax._src import distributed

    return getattr(distributed.global_state, "client", None) is not None


def _backends_started() -> bool:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def _own_host() -> str:
    host = os.environ.get("MASTER_ADDR")
    if host:
        return host
    return socket.gethostbyname(socket.gethostname())


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _coordinator_address(store, rank: int) -> str:
    if rank == 0:
        address = RUNTIME.options.coordinator_address
        if address is None:
            host = _own_host()
            port = _free_port(host)
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        store.set(_COORDINATOR_KEY, address)
        return address
    return store.get(_COORDINATOR_KEY).decode()


def ensure_started(store, rank: int, world_size: int, timeout: datetime.timedelta | None) -> None:
    """Start JAX's multi-process runtime for a job of ``world_size`` processes.

    Idempotent. With one process nothing is started. When the user already
    started ``jax.distributed`` (e.g. on a TPU pod, where JAX finds its peers
    by itself), it is checked against torch's rank and world size.
    """
    with RUNTIME.lock:
        if RUNTIME.world_size is not None:
            return
        if _jax_distributed_started():
            if (jax.process_count(), jax.process_index()) != (world_size, rank):
                raise RuntimeError(
                    f"lazytpu: jax.distributed runs {jax.process_count()} processes with this one as "
                    f"{jax.process_index()}, but torch.distributed says rank {rank} of {world_size}"
                )
        elif world_size == 1:
            return  # nothing to start (and a later job of several processes still can)
        else:
            _start(store, rank, world_size, timeout)
        if jax.process_count() > 1:
            _use_process_local_devices()
            _no_disk_cache_across_processes()
            # Creating JAX's client is itself a rendezvous of every process:
            # do it here, where all ranks are, not at some rank's first tensor.
            platform.devices()
        RUNTIME.world_size = world_size


def _start(store, rank: int, world_size: int, timeout: datetime.timedelta | None) -> None:
    if _backends_started():
        raise RuntimeError(
            "lazytpu: init_process_group(backend='tpu_dist') must run before the first tpu tensor "
            "(or torch.tpu call) of the process: JAX's multi-process runtime can only start before "
            "JAX creates its devices"
        )
    address = RUNTIME.coordinator_address = _coordinator_address(store, rank)
    if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    opts = RUNTIME.options
    init_timeout = opts.initialization_timeout_s
    if init_timeout is None:
        init_timeout = int(timeout.total_seconds()) if timeout is not None else 300
    jax.distributed.initialize(
        coordinator_address=address,
        num_processes=world_size,
        process_id=rank,
        local_device_ids=opts.local_device_ids,
        coordinator_bind_address=address if rank == 0 else None,
        initialization_timeout=max(init_timeout, 1),
        heartbeat_timeout_seconds=opts.heartbeat_timeout_s,
        shutdown_timeout_seconds=opts.shutdown_timeout_s,
    )


def _use_process_local_devices() -> None:
    """Note [Process-local devices]: once ``jax.distributed`` runs,
    ``jax.devices()`` lists every process's devices, but a process can only
    compute on its own (``jax.local_devices()``); ``tpu:i`` must name this
    process's i-th device. ``runtime.platform.devices`` lists all of them, so
    until it filters by process itself it is narrowed here, once. When it
    already returns only local devices this changes nothing.
    """
    listed = platform.devices
    if getattr(listed, "_lt_process_local", False):
        return

    @functools.cache
    def process_local_devices() -> tuple:
        return tuple(d for d in listed() if d.process_index == jax.process_index())

    process_local_devices._lt_process_local = True
    platform.devices = process_local_devices


def _no_disk_cache_across_processes() -> None:
    """Note [Disk cache and jax.distributed]: the disk compile cache loads an
    entry onto every device of the JAX client; once ``jax.distributed`` runs
    that is every process's devices, and the loaded program's results span
    processes (unusable here). Until the cache loads onto the one device it
    compiles for, it is off in multi-process jobs.
    """
    _config.CACHE_DIR.value = "off"


def started() -> bool:
    """Whether ``ensure_started`` ran in this process."""
    return RUNTIME.world_size is not None


# -- meshes ---------------------------------------------------------------------

AXIS = "ranks"


@functools.cache
def _devices_of_process(process: int) -> tuple:
    """The devices of JAX process ``process``, in local index order."""
    kind = platform.device(0).platform
    return tuple(sorted((d for d in jax.devices(kind) if d.process_index == process), key=lambda d: d.id))


@functools.cache
def mesh(ranks: tuple[int, ...], index: int) -> jax.sharding.Mesh:
    """The 1-d mesh of a group: device ``index`` of each of ``ranks`` (global ranks).

    Every process of a group uses the same local device index (one process
    per chip: index 0).
    """
    if len(ranks) == 1:
        devices = [platform.device(index)]
    else:
        devices = [_devices_of_process(r)[index] for r in ranks]
    return jax.sharding.Mesh(np.array(devices), (AXIS,))


# -- the world as a mesh of several axes (Note [Subgroups in the world mesh] in ingraph) --------

CUT_AXIS = "stride"  # an axis of a world mesh is named by its stride: "stride1", "stride2", ...


def line(ranks: tuple[int, ...], world: int) -> tuple[int, int] | None:
    """``(stride, size)`` when ``ranks`` (global ranks, in group-rank order)
    are ``base + stride * i`` for ``i < size``, and the groups of that stride
    and size tile the world (``stride * size`` divides it, ``base`` is the
    first of its block); else ``None``. Groups of one rank are ``None``."""
    size = len(ranks)
    if size < 2:
        return None
    stride = ranks[1] - ranks[0]
    if stride <= 0 or world % (stride * size) or ranks[0] % (stride * size) >= stride:
        return None
    if any(r != ranks[0] + stride * i for i, r in enumerate(ranks)):
        return None
    return stride, size


def merge_cuts(cuts: tuple[int, ...], group: tuple[int, int], world: int) -> tuple[int, ...] | None:
    """The cuts of a mesh of ``world`` processes holding both ``cuts`` and the
    axes of ``group`` (``(stride, size)``), or ``None`` when no mesh does:
    every cut must divide the next."""
    merged = tuple(sorted({1, world, *cuts, group[0], group[0] * group[1]}))
    if any(b % a for a, b in zip(merged, merged[1:])):
        return None
    return merged


@functools.cache
def world_mesh(cuts: tuple[int, ...], index: int) -> jax.sharding.Mesh:
    """Device ``index`` of every process as a row-major mesh cut at ``cuts``
    (``1 = c0 < c1 < ... < cm = world``): axis ``stride{c}`` has stride ``c``
    and size ``c_next / c``, outermost first. A world of one: one axis of one."""
    world = cuts[-1]
    if world == 1:
        return jax.sharding.Mesh(np.array([platform.device(index)]), (f"{CUT_AXIS}1",))
    devices = np.array([_devices_of_process(r)[index] for r in range(world)], dtype=object)
    inner = cuts[:-1][::-1]
    shape = tuple(b // a for a, b in zip(cuts, cuts[1:]))[::-1]
    return jax.sharding.Mesh(devices.reshape(shape), tuple(f"{CUT_AXIS}{c}" for c in inner))


def group_axes(axis_names, axis_sizes, group: tuple[int, int]) -> tuple[str, ...]:
    """The axes of a world mesh (Note [Subgroups in the world mesh]) that
    ``group`` (``(stride, size)``) spans, outermost first: its ranks in order."""
    stride, size = group
    axes = []
    for name, n in zip(axis_names, axis_sizes):
        c = int(name.removeprefix(CUT_AXIS))
        if stride <= c and c * n <= stride * size:
            axes.append(name)
    return tuple(axes)


def _clear() -> None:
    _devices_of_process.cache_clear()
    mesh.cache_clear()
    world_mesh.cache_clear()


_caches.register("distributed_meshes", _clear)
