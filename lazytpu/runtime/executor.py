"""Compile programs once per canonical key and execute them."""

from __future__ import annotations

import collections
import contextlib
import functools
import math
import threading
import time
import warnings

import jax
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from lazytpu import _caches, _config, metrics
from lazytpu.ir.source import user_stacklevel
from lazytpu.runtime import memory, persistent
from lazytpu.runtime.platform import device, devices


def _mappings() -> int:
    """The memory mappings this process holds (0 where ``/proc`` has none)."""
    try:
        with open("/proc/self/maps", "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return 0


@functools.cache
def _mappings_limit() -> int:
    """The kernel's limit on a process's mappings (Linux's default where unreadable)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530


class _ProgramCache:
    """In-memory cache of compiled executables, keyed by program key.

    Note [Program cache bound]: each compiled program holds a few MB and tens
    to hundreds of memory mappings (XLA:CPU's code for it) until it is dropped, and the
    kernel allows a process 65,530 mappings: an unbounded cache crashed a loop
    over a few hundred distinct shapes. At most ``LAZYTPU_PROGRAM_CACHE_SIZE``
    programs are kept; past it the least recently used one is evicted, and
    nothing else holds it (the ``jax.jit`` object and the ``Lowered`` die
    with ``_compile``), so its memory is released. Evictions are counted
    (``programs_evicted``); an evicted program needed again means the
    workload cycles over more programs than the bound: warned once. JAX
    keeps tracing and lowering caches of its own per shape (about 13 KB a
    program, measured with ``examples/shapes_soak.py``-like loops): each time
    another ``bound`` programs have been evicted, ``jax.clear_caches()``
    drops them (our compiled programs are not JAX's to clear), so a stream
    of new shapes runs at flat memory; a workload that never evicts never
    clears them.

    A program's mappings grow with its size (a graph-capped program of about
    600 ops holds about 470): 256 such programs are past the kernel's limit,
    and a loop flushing at the graph cap crashed in XLA after about 130
    compiles. So the cache also keeps the process's mappings below half the
    limit (``vm.max_map_count``): a compile that finds them past it evicts
    the least recently used half of the cache.

    Hits and evictions are counted here only (``cache_info``); the metrics'
    ``cache_hits`` and ``programs_evicted`` are folded from these counts
    (``fold``) at each snapshot.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # key -> [compiled, tick of its last use]: a hit hashes its (large) key once, no
        # reordering; an eviction (on a miss, beside a compile) scans for the oldest tick.
        self.entries: dict = {}
        self.evicted: collections.OrderedDict = collections.OrderedDict()  # hashes of evicted keys
        self.tick = 0
        # since the last clear; the metrics have those up to the marks (``fold``)
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.folded_hits = self.folded_evictions = 0
        self.warned = False

    def clear(self) -> None:
        with self.lock:
            self._fold()
            self.entries.clear()
            self.evicted.clear()
            self.hits = self.misses = self.evictions = 0
            self.folded_hits = self.folded_evictions = 0
            self.warned = False

    def fold(self) -> None:
        """Add the hits and evictions since the last fold to the metrics."""
        with self.lock:
            self._fold()

    def _fold(self) -> None:
        hits, self.folded_hits = self.hits - self.folded_hits, self.hits
        evictions, self.folded_evictions = self.evictions - self.folded_evictions, self.evictions
        if hits:
            metrics.add("cache_hits", hits)
        if evictions:
            metrics.add("programs_evicted", evictions)

    def lookup(self, key):
        """Step 4 of a flush, cached? (Note [Flush steps] in
        lazytpu.engine_flush): the program compiled for ``key``, or None."""
        with self.lock:
            entry = self.entries.get(key)
            if entry is None:
                return None
            self.tick += 1
            entry[1] = self.tick
            self.hits += 1
            return entry[0]

    def insert(self, key, compiled) -> None:
        bound = max(1, _config.PROGRAM_CACHE_SIZE.get())
        with self.lock:
            self.misses += 1
            self.tick += 1
            again = self.evicted.pop(hash(key), False)
            self.entries[key] = [compiled, self.tick]
            dropped = []
            keep = bound
            if _mappings() > _mappings_limit() // 2:  # Note [Program cache bound]
                keep = min(bound, max(1, len(self.entries) // 2))
            while len(self.entries) > keep:
                old, entry = min(self.entries.items(), key=lambda item: item[1][1])
                del self.entries[old]
                dropped.append(entry)
                self.evicted[hash(old)] = True
                self.evictions += 1
            while len(self.evicted) > bound:
                self.evicted.popitem(last=False)
            warn, self.warned = again and not self.warned, self.warned or again
            clear = dropped and self.evictions // bound > (self.evictions - len(dropped)) // bound
        del dropped  # released here, outside the lock
        if clear:
            jax.clear_caches()  # JAX's per-shape caches (Note [Program cache bound])
        if warn:
            warnings.warn(
                f"lazytpu: a compiled program evicted from the in-memory program cache "
                f"(LAZYTPU_PROGRAM_CACHE_SIZE={bound}) was needed again and compiled again: this workload "
                "cycles over more distinct programs than the cache holds; a larger LAZYTPU_PROGRAM_CACHE_SIZE "
                "saves these compiles (at a few MB of memory per program)",
                stacklevel=user_stacklevel(),
            )


_CACHE = _caches.table("programs", _ProgramCache)
metrics.register_folder(_CACHE.fold)


def _compile(key, fn, inputs, index: int, donate: tuple, on_compile, shardings: tuple | None = None):
    """Compile ``fn`` (a JAX function) for the device ``index``: ``jax.jit``
    lowering, the ``on_compile`` observers, then XLA's compile or the
    persistent cache. With the ``shardings`` of its inputs, over their mesh,
    its outputs sharded as the compiler chooses (Note [SPMD programs])."""
    start = time.perf_counter()
    if shardings is None:
        sharding, mesh = SingleDeviceSharding(device(index)), contextlib.nullcontext()
    else:  # traced under the mesh: rules may constrain shardings (Note [SPMD programs])
        sharding, mesh = None, jax.set_mesh(next(s.mesh for s in shardings if type(s) is NamedSharding))
    with warnings.catch_warnings(), mesh:
        # An input donated but not reusable by any output is simply freed: not news. Filtered
        # here, not globally, so that a caller's warning filters (pytest's, say) cannot undo it.
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        lowered = jax.jit(fn, out_shardings=sharding, donate_argnums=donate).lower(*inputs)
    if on_compile is not None:
        on_compile(lowered)
    signature = repr((jax.tree_util.tree_structure(inputs), [jax.typeof(x) for x in inputs], donate, shardings))
    compiled = persistent.load_or_compile(lowered, device(index), signature)
    metrics.add("compile_seconds", time.perf_counter() - start)
    metrics.add("programs_compiled")
    return compiled


def execute(
    key, make_fn, inputs: list, *, index: int = 0, blocking: bool = False, donate: tuple = (), on_compile=None
) -> tuple:
    """Run the program ``key`` on ``inputs``; compile it on a miss.

    Args:
        key: the canonical program key.
        make_fn: builds the JAX function on a cache miss.
        inputs: device buffers and Python scalars, in input order.
        index: device index.
        blocking: wait for the results (strict-blocking mode).
        donate: positions of input buffers nothing needs after this program
            (Note [Donation]); part of ``key``.
        on_compile: called with the ``jax.stages.Lowered`` on a cache miss
            (recompile explanations, dumps).
    """
    counted, shardings = index, None
    if index in _SPMD_DEVICES:  # Note [SPMD programs]
        inputs, shardings, counted, donate = _place(inputs, index, donate)
        if shardings is not None:
            key = (key, shardings)
    return run_program(
        key,
        lambda: _compile(key, make_fn(), inputs, index, donate, on_compile, shardings),
        inputs,
        blocking,
        index=counted,
        donate=donate,
    )


# Note [SPMD programs]: a device's buffer may be a global ``jax.Array``
# sharded over a mesh of this process's devices (``shard_buffer``, which
# Note [Sharded tensors] in lazytpu.distributed.spmd uses). From the first
# one on, each program of that device looks at its inputs' shardings
# (``_place``; other devices never pay for it). If an input is sharded (not
# fully replicated) over several devices, the program is compiled as one SPMD
# program over that input's mesh: ``jax.jit`` with no ``out_shardings``, so
# XLA's partitioner propagates the inputs' shardings through the program,
# inserts the collectives it needs and chooses the outputs' shardings (an
# optimizer's update of a sharded parameter or of its state comes out
# sharded as it: measured for SGD and AdamW on an MLP and a Llama). Its
# single-device inputs are first copied to every device of the mesh
# (replicated; a program output, such as the random state, is on the mesh
# already). The inputs' shardings are part of the program's key, and the
# outputs' shardings a fixed point of a step after its first: the next step
# is a cache hit. With no sharded input the program runs on the device alone,
# as before, a replicated input read from its copy on the device (no copy).
# An SPMD program is traced under its mesh (``jax.set_mesh``), so a rule can
# read it (``jax.sharding.get_abstract_mesh()``) and constrain a value's
# sharding to a ``PartitionSpec``; in a program of one device the mesh is
# empty. Each device of the mesh counts a buffer's shard on it (Note [Device
# memory]).
_SPMD_DEVICES: set[int] = set()  # the devices whose programs look at shardings


def shard_buffer(buffer, sharding, index: int):
    """``buffer`` laid out as ``sharding`` (a ``jax.sharding.NamedSharding``
    over several devices), counted on each; from now on the programs of
    device ``index``, the tensor's, may be SPMD programs (Note [SPMD programs])."""
    _SPMD_DEVICES.add(index)
    array = jax.device_put(buffer, sharding)
    nbytes = math.prod(sharding.shard_shape(array.shape)) * array.dtype.itemsize
    for i in _indices(sharding):
        memory.of(i).track((array,), (nbytes,))
    return array


def _indices(sharding) -> tuple[int, ...]:
    """The lazytpu device indices of the devices of ``sharding``."""
    where = {d: i for i, d in enumerate(devices())}
    return tuple(sorted(where[d] for d in sharding.device_set))


_EMPTIES = _caches.table("replicated_empties")  # (shape, dtype, sharding) -> an empty array there


def _place(inputs: list, index: int, donate: tuple) -> tuple[list, tuple | None, tuple | int, tuple]:
    """The arguments of a program of device ``index`` as it runs them (Note
    [SPMD programs]): ``(args, shardings, devices, donate)``; ``shardings``
    (part of the key) is None for a program of the device alone.
    Single-device inputs are copied to the mesh in one ``device_put``; an
    empty one, which holds nothing (a Hugging Face cache's ``torch.tensor([])``
    each forward: a copy costs 0.1-1 ms on XLA:CPU), is one of ``_EMPTIES``,
    never donated."""
    shardings = [getattr(a, "sharding", None) for a in inputs]
    mesh = next((s.mesh for s in shardings if type(s) is NamedSharding and not s.is_fully_replicated), None)
    if mesh is None:
        home = device(index)
        args = [_copy_on(a, home) if type(s) is NamedSharding else a for a, s in zip(inputs, shardings)]
        return args, None, index, donate
    replicated = NamedSharding(mesh, PartitionSpec())
    single = [type(s) is SingleDeviceSharding for s in shardings]
    args, moved = list(inputs), []
    for i, one in enumerate(single):
        if one and inputs[i].size:
            moved.append(i)
        elif one:
            empty = (inputs[i].shape, inputs[i].dtype, replicated)
            found = _EMPTIES.get(empty)
            if found is None:
                found = _EMPTIES[empty] = jax.device_put(inputs[i], replicated)
            args[i] = found
    if moved:
        for i, copy in zip(moved, jax.device_put([inputs[i] for i in moved], [replicated] * len(moved))):
            args[i] = copy
    shardings = tuple(replicated if one else s for s, one in zip(shardings, single))
    donate = tuple(i for i in donate if not single[i] or inputs[i].size)
    return args, shardings, _indices(replicated), donate


def _copy_on(array, home):
    """A replicated ``array``'s copy on the device ``home``."""
    for shard in array.addressable_shards:
        if shard.device == home:
            return shard.data
    return jax.device_put(array, home)


def run_program(key, compile_fn, args: list, blocking: bool = False, index=None, donate: tuple = ()):
    """Run the cached program ``key`` on ``args``, compiling it with
    ``compile_fn()`` on a miss (also the runner of ``distributed.ingraph``):
    steps 4-6 of a flush, cached?, compile, execute (Note [Flush steps] in
    lazytpu.engine_flush). With an ``index``, its buffers are counted on
    that device (``run_compiled``)."""
    compiled = _CACHE.lookup(key)
    if compiled is None:
        compiled = compile_program(key, compile_fn)
    return run_compiled(compiled, args, blocking, index=index, donate=donate)


def compile_program(key, compile_fn):
    """Step 5 of a flush, compile (a miss of the program cache): the program
    ``compile_fn()`` compiles, kept in the cache for ``key``."""
    metrics.add("cache_misses")
    compiled = compile_fn()
    _CACHE.insert(key, compiled)
    return compiled


def run_compiled(compiled, args: list, blocking: bool = False, index=None, donate: tuple = ()):
    """Step 6 of a flush, execute: dispatch ``compiled`` on ``args`` (its
    outputs are still computing unless ``blocking``). With an ``index`` (or
    a tuple of them, an SPMD program's devices), the program's peak, its
    ``donate``d inputs and its outputs are counted on that device (Note
    [Device memory] in lazytpu.runtime.memory)."""
    start = time.perf_counter()
    outputs = compiled(*args)
    if index is not None:  # the devices of a mesh: a tuple (Note [SPMD programs])
        for i in index if type(index) is tuple else (index,):
            memory.of(i).ran(compiled, args, donate, outputs)
    if blocking:
        jax.block_until_ready(outputs)
    metrics.add("execute_seconds", time.perf_counter() - start)
    metrics.add("programs_executed")
    return outputs


def cache_info() -> dict:
    """The program caches: in-memory entries, hits, misses, evictions and
    the bound (``size``); disk entries and bytes."""
    disk_entries, disk_bytes = persistent.disk_usage()
    with _CACHE.lock:
        return {
            "entries": len(_CACHE.entries),
            "hits": _CACHE.hits,
            "misses": _CACHE.misses,
            "evictions": _CACHE.evictions,
            "size": max(1, _config.PROGRAM_CACHE_SIZE.get()),
            "disk_entries": disk_entries,
            "bytes": disk_bytes,
        }


def clear_caches(disk: bool = False) -> None:
    """Clear every in-memory cache (compiled programs, meta-kernel memo, ...);
    with ``disk=True`` also delete the persistent compile cache."""
    _caches.clear_all()
    if disk:
        persistent.clear()
