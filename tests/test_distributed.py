"""torch.distributed on ``tpu`` (the ``tpu_dist`` backend): real processes on 127.0.0.1.

Tests launch ranks of this file as a script (``python test_distributed.py JOB``)
with a torchrun-style environment. Each rank runs the job's sections, checks
its results against CPU torch and prints ``OK <section>``; a test asserts its
section passed on every rank. The launcher kills every rank at a deadline, and
each worker dumps its stacks and exits on its own watchdog, so a hung or dead
rank fails the test instead of hanging CI.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time

from dist_harness import LAUNCH_TIMEOUT_S, Harness, Job, report

# -- the tests ----------------------------------------------------------------------------
# Two jobs share a launch each (starting ranks costs ~15 s on 2 cores):
# "defer" runs every collective and DDP in defer mode with backend "tpu_dist";
# "strict" runs in strict mode with "cpu:gloo,tpu:tpu" (the alias) and ends
# with rank 1 dying.


def test_collectives():
    assert_section("defer", "collectives")


def test_jax_coordinator_binds_master_addr_only():
    assert_section("defer", "coordinator_bind")


def test_functional_collectives_and_subgroups():
    assert_section("defer", "functional")


def test_ddp_mlp_matches_single_process_training():
    assert_section("defer", "ddp_mlp")


def test_ddp_transformer_matches_single_process_training():
    assert_section("defer", "ddp_transformer")


def test_ddp_step_is_one_program_with_in_graph_all_reduce():
    assert_section("defer", "in_graph")


def test_collectives_of_rank_dependent_numbers():
    assert_section("defer", "rank_numbers")


def test_a_collective_one_rank_drops_still_runs():
    assert_section("defer", "dropped_collective")


def test_ddp_options_needing_pinned_memory_fail_at_construction():
    assert_section("defer", "ddp_unsupported_options")


def test_defer_job_exits_cleanly():
    results = run_job("defer")
    assert all(code == 0 for code, _ in results), report(results)


def test_mixed_gloo_and_tpu_alias_backend():
    assert_section("strict", "mixed")


def test_collectives_in_strict_mode():
    assert_section("strict", "strict_collectives")


def test_dead_rank_fails_the_survivor_with_a_clear_error():
    (out, _) = assert_section("strict", "dead_rank", ranks=(0,))
    assert "survivor saw:" in out and "Connection" in out, out
    assert run_job("strict")[1][0] == 3  # the rank that died


def test_four_ranks_groups_and_point_to_point():
    assert_section("four", "four_ranks")


def test_hung_rank_is_stopped_by_its_watchdog():
    results = run_job("hang")
    assert all(code not in (0, None) for code, _ in results), report(results)
    assert "Timeout" in results[1][1] and "_section_hang" in results[1][1], report(results)


def test_world_of_one_in_this_process():
    """One rank: no JAX runtime to start; collectives are one-device programs."""
    import torch
    import torch.distributed as dist
    from torch.testing import assert_close

    from lazytpu.distributed import ProcessGroupTPU

    dist.init_process_group(backend="tpu_dist", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert dist.get_backend() == "tpu_dist" and isinstance(dist.group.WORLD, ProcessGroupTPU)
        t = torch.arange(6.0, device="tpu").reshape(2, 3)
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        dist.broadcast(t, src=0)
        assert dist.all_reduce(t, async_op=True).wait()
        assert_close(t.cpu(), torch.arange(6.0).reshape(2, 3))
        out = torch.empty(2, 3, device="tpu")
        dist.all_gather_single(out, t)  # torch 2.13's names of all_gather_into_tensor ...
        dist.reduce_scatter_single(out, out.clone())  # ... and reduce_scatter_tensor
        dist.all_to_all_single(out, out.clone())
        assert_close(out.cpu(), torch.arange(6.0).reshape(2, 3))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_init_after_first_tpu_tensor_raises():
    assert_alone("init_too_late", "init_too_late")


def test_many_devices_in_one_process():
    assert_alone("devices", "devices")


def test_each_device_computes_on_itself():
    assert_alone("devices", "placement")


def test_copies_between_devices_and_local_mesh_collectives():
    assert_alone("devices", "local_mesh")


def test_the_current_device_is_each_threads_and_names_index_less_devices():
    """Factories of ``"tpu"``, ``torch.accelerator``'s device index, streams, generators and events
    follow the calling thread's current device, as CUDA's (Note [Current device] in runtime/platform)."""
    assert_alone("devices", "current_device")


def test_single_process_data_parallel_example():
    """examples/distributed_single_process.py: 8 replicas on 8 devices of one
    process, gradients averaged over a LocalMesh, match CPU training."""
    example = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    proc = subprocess.run(
        [sys.executable, os.path.join(example, "distributed_single_process.py")],
        env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8"),
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8 devices" in proc.stdout and "single-device training on the whole batch: True" in proc.stdout, proc.stdout


# -- workers (the rank side) ---------------------------------------------------------------


def _mine(r, shape=(3,), dtype=None):
    """Rank ``r``'s input: distinct per rank and element."""
    import torch

    return (torch.arange(torch.Size(shape).numel()).reshape(shape) + 10 * r + 1).to(dtype or torch.float32)


def _section_collectives(rank, world):
    import torch
    import torch.distributed as dist
    from torch.testing import assert_close

    mine = _mine

    def on_tpu(t):
        return t.to("tpu")

    ranks = range(world)

    # all_reduce: every op, sync and async, several dtypes
    reductions = {
        dist.ReduceOp.SUM: lambda ts: torch.stack(ts).sum(0),
        dist.ReduceOp.AVG: lambda ts: torch.stack(ts).mean(0),
        dist.ReduceOp.MAX: lambda ts: torch.stack(ts).amax(0),
        dist.ReduceOp.MIN: lambda ts: torch.stack(ts).amin(0),
        dist.ReduceOp.PRODUCT: lambda ts: torch.stack(ts).prod(0),
    }
    for op, expect in reductions.items():
        for async_op in (False, True):
            t = on_tpu(mine(rank, (2, 3)))
            work = dist.all_reduce(t, op=op, async_op=async_op)
            if async_op:
                assert work.wait()
                assert_close(work.get_future().wait()[0].cpu(), expect([mine(r, (2, 3)) for r in ranks]))
            else:
                assert work is None
            assert_close(t.cpu(), expect([mine(r, (2, 3)) for r in ranks]))
    for dtype in (torch.int64, torch.int32, torch.bfloat16, torch.float64, torch.complex64):
        t = on_tpu(mine(rank, dtype=dtype))
        dist.all_reduce(t)
        assert_close(t.cpu(), sum(mine(r, dtype=dtype) for r in ranks))
    flags = on_tpu(torch.tensor([rank == 0, False, True]))
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    assert_close(flags.cpu(), torch.tensor([True, False, True]))
    scalar = on_tpu(torch.tensor(float(rank + 1)))
    dist.all_reduce(scalar)
    assert_close(scalar.cpu(), torch.tensor(float(sum(r + 1 for r in ranks))))
    # in place through a non-contiguous view: the base sees it
    base = on_tpu(torch.zeros(3, 4) + rank)
    column = base[:, 1]
    dist.all_reduce(column)
    expected = torch.zeros(3, 4) + rank
    expected[:, 1] = sum(ranks)
    assert_close(base.cpu(), expected)
    # pending work feeding a collective, and a collective feeding more work
    x = on_tpu(mine(rank)) * 2 + 1
    dist.all_reduce(x)
    assert_close((x * 3).cpu(), sum(mine(r) * 2 + 1 for r in ranks) * 3)

    # broadcast (from the last rank), several dtypes
    for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16, torch.complex64):
        t = on_tpu(mine(rank, dtype=dtype))
        dist.broadcast(t, src=world - 1)
        assert_close(t.cpu(), mine(world - 1, dtype=dtype))
    work = dist.broadcast(t := on_tpu(mine(rank)), src=0, async_op=True)
    work.wait()
    assert_close(t.cpu(), mine(0))

    # gathers
    outs = [on_tpu(torch.empty(2, 3)) for _ in ranks]
    dist.all_gather(outs, on_tpu(mine(rank, (2, 3))))
    for r, o in zip(ranks, outs):
        assert_close(o.cpu(), mine(r, (2, 3)))
    flat = on_tpu(torch.empty(world * 2, 3))
    dist.all_gather_into_tensor(flat, on_tpu(mine(rank, (2, 3))))
    assert_close(flat.cpu(), torch.cat([mine(r, (2, 3)) for r in ranks]))
    stacked = on_tpu(torch.empty(world, 2, 3))
    dist.all_gather_into_tensor(stacked, on_tpu(mine(rank, (2, 3))), async_op=True).wait()
    assert_close(stacked.cpu(), torch.stack([mine(r, (2, 3)) for r in ranks]))
    gathered = [on_tpu(torch.empty(3)) for _ in ranks] if rank == 0 else None
    dist.gather(on_tpu(mine(rank)), gathered, dst=0)
    if rank == 0:
        assert_close(torch.stack([g.cpu() for g in gathered]), torch.stack([mine(r) for r in ranks]))
    objects = [None] * world
    dist.all_gather_object(objects, {"rank": rank})
    assert objects == [{"rank": r} for r in ranks]

    # reduce-scatter
    for op, expect in (
        (dist.ReduceOp.SUM, reductions[dist.ReduceOp.SUM]),
        (dist.ReduceOp.MAX, reductions[dist.ReduceOp.MAX]),
    ):
        out = on_tpu(torch.empty(2, 3))
        dist.reduce_scatter_tensor(out, on_tpu(mine(rank, (world * 2, 3))), op=op)
        assert_close(out.cpu(), expect([mine(r, (world * 2, 3)) for r in ranks])[rank * 2 : (rank + 1) * 2])
    out = on_tpu(torch.empty(3))
    dist.reduce_scatter(out, [on_tpu(mine(rank) * (i + 1)) for i in ranks])
    assert_close(out.cpu(), sum(mine(r) * (rank + 1) for r in ranks))
    t = on_tpu(mine(rank))
    dist.reduce(t, dst=0)
    assert_close(t.cpu(), sum(mine(r) for r in ranks) if rank == 0 else mine(rank))

    # scatter
    out = on_tpu(torch.empty(3))
    dist.scatter(out, [on_tpu(mine(i)) for i in ranks] if rank == world - 1 else None, src=world - 1)
    assert_close(out.cpu(), mine(rank))

    # all-to-all: equal and uneven splits, and the list form
    t = on_tpu(mine(rank, (world * 2,)))
    out = on_tpu(torch.empty(world * 2))
    dist.all_to_all_single(out, t)
    assert_close(out.cpu(), torch.cat([mine(r, (world * 2,))[rank * 2 : rank * 2 + 2] for r in ranks]))

    def splits(src):  # rank src sends (src + dst + 1) rows to rank dst
        return [src + dst + 1 for dst in ranks]

    sent = mine(rank, (sum(splits(rank)), 2))
    out = on_tpu(torch.empty(sum(splits(r)[rank] for r in ranks), 2))
    dist.all_to_all_single(out, on_tpu(sent), [splits(r)[rank] for r in ranks], splits(rank))
    expected = []
    for r in ranks:
        rows = mine(r, (sum(splits(r)), 2))
        start = sum(splits(r)[:rank])
        expected.append(rows[start : start + splits(r)[rank]])
    assert_close(out.cpu(), torch.cat(expected))
    outs = [on_tpu(torch.empty(rank + 1)) for _ in ranks]
    dist.all_to_all(outs, [on_tpu(torch.full((dst + 1,), float(10 * rank + dst))) for dst in ranks])
    for r, o in zip(ranks, outs):
        assert_close(o.cpu(), torch.full((rank + 1,), float(10 * r + rank)))

    # point to point
    t = on_tpu(mine(rank))
    if rank == 0:
        dist.send(t, dst=1)
    elif rank == 1:
        dist.recv(t, src=0)
        assert_close(t.cpu(), mine(0))


def _section_functional(rank, world):
    import torch
    import torch.distributed as dist
    from torch.testing import assert_close

    mine, ranks = _mine, range(world)

    def on_tpu(t):
        return t.to("tpu")

    # functional collectives
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    t = on_tpu(mine(rank))
    assert_close(funcol.wait_tensor(funcol.all_reduce(t, "sum", group)).cpu(), sum(mine(r) for r in ranks))
    assert_close(t.cpu(), mine(rank))  # out of place
    assert_close(funcol.all_gather_tensor(t, 0, group).cpu(), torch.cat([mine(r) for r in ranks]))
    rs = funcol.reduce_scatter_tensor(on_tpu(mine(rank, (world * 2,))), "sum", 0, group)
    assert_close(rs.cpu(), sum(mine(r, (world * 2,)) for r in ranks)[rank * 2 : rank * 2 + 2])

    # a sub-group (every rank, in reverse order) and barrier
    reverse = dist.new_group(list(reversed(ranks)))
    t = on_tpu(mine(rank))
    dist.all_reduce(t, group=reverse)
    assert_close(t.cpu(), sum(mine(r) for r in ranks))
    dist.barrier()
    dist.barrier(group=reverse)


def _section_coordinator_bind(rank, world):
    """JAX's coordinator (on rank 0) listens on MASTER_ADDR only, not on a wildcard address."""
    from lazytpu.distributed import jax_runtime

    if rank != 0 or not os.path.exists("/proc/net/tcp"):
        return
    port = int(jax_runtime.RUNTIME.coordinator_address.rsplit(":", 1)[1])
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    listening.append(address)
    assert listening, f"nothing listens on the coordinator port {port}"
    assert all(a.strip("0") for a in listening), f"a wildcard address listens on port {port}: {listening}"


def _section_strict_collectives(rank, world):
    import torch
    import torch.distributed as dist
    from torch.testing import assert_close

    assert torch.tpu.eager_mode is torch.tpu.EagerMode.DEFER_NEVER
    ranks = range(world)
    t = (_mine(rank) * 2).to("tpu")
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert_close(t.cpu(), sum(_mine(r) * 2 for r in ranks) / world)
    t = _mine(rank, (2, 3)).to("tpu")[:, 1:]
    dist.broadcast(t, src=1)
    assert_close(t.cpu(), _mine(1, (2, 3))[:, 1:])
    out = torch.empty(world * 3, device="tpu")
    dist.all_gather_into_tensor(out, _mine(rank).to("tpu"))
    assert_close(out.cpu(), torch.cat([_mine(r) for r in ranks]))


def _section_mixed(rank, world):
    import torch
    import torch.distributed as dist
    from torch.testing import assert_close

    total = float(sum(r + 1 for r in range(world)))
    cpu = torch.full((2,), float(rank + 1))
    dist.all_reduce(cpu)
    assert cpu.device.type == "cpu"
    assert_close(cpu, torch.full((2,), total))
    tpu = torch.full((2,), float(rank + 1), device="tpu")
    dist.all_reduce(tpu)
    assert tpu.device.type == "tpu"
    assert_close(tpu.cpu(), torch.full((2,), total))
    objects = [None] * world
    dist.all_gather_object(objects, rank)  # object collectives run on CPU here (gloo)
    assert objects == list(range(world))


class _TinyTransformer:
    """A one-block causal transformer (built lazily: torch is imported in workers only)."""

    @staticmethod
    def make():
        import torch
        import torch.nn.functional as F

        class Block(torch.nn.Module):
            def __init__(self, vocab=20, width=16):
                super().__init__()
                self.embed = torch.nn.Embedding(vocab, width)
                self.ln = torch.nn.LayerNorm(width)
                self.qkv = torch.nn.Linear(width, 3 * width)
                self.head = torch.nn.Linear(width, vocab)

            def forward(self, tokens):
                x = self.embed(tokens)
                q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
                x = x + F.scaled_dot_product_attention(q, k, v, is_causal=True)
                return self.head(x)

        torch.manual_seed(0)
        return Block()


def _held() -> int:
    """The bytes of this rank's device buffers live now."""
    import gc

    import torch

    gc.collect()
    torch.tpu.synchronize()
    return torch.tpu.memory_allocated()


def _tiny_mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _check_ddp(rank, world, make, batches, loss_fn, momentum, **ddp_options):
    """Train ``make()`` under DDP (each rank on its slice of every batch) and
    on CPU over the whole batches; the parameters must agree, on every rank."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.testing import assert_close

    reference = make()
    start = _held()
    model = copy.deepcopy(reference)
    if rank != 0:  # DDP must start every rank from rank 0's parameters
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ddp = DDP(model.to("tpu"), **ddp_options)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=momentum)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=momentum)
    per_rank = batches[0][0].shape[0] // world
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(ddp(x[mine].to("tpu")), y[mine].to("tpu")).backward()
        opt.step()
        ref_opt.zero_grad()
        loss_fn(reference(x), y).backward()
        ref_opt.step()
    # Held: parameters, DDP's gradient buckets, and the gradients (views of the
    # buckets, or tensors of their own) or SGD's momentum buffers: three times the
    # parameters' bytes. The in-graph all-reduce donates each bucket: its old buffer
    # is not counted once donated (it was, while anything held its deleted array).
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert _held() - start == 3 * nbytes, (_held() - start, nbytes)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5, msg=f"parameter {name} differs")
        high, low = p.detach().clone(), p.detach().clone()
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        assert torch.equal(high.cpu(), low.cpu()), f"ranks hold different values of {name}"


def _section_ddp_mlp(rank, world):
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(world * 4, 8, generator=g), torch.randn(world * 4, 4, generator=g)) for _ in range(4)]
    # gradients as views of the all-reduced buckets (written through aliasing)
    _check_ddp(rank, world, _tiny_mlp, batches, F.mse_loss, momentum=0.9, gradient_as_bucket_view=True)


def _section_ddp_transformer(rank, world):
    import torch
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(2)
    batches = [
        (torch.randint(0, 20, (world * 2, 6), generator=g), torch.randint(0, 20, (world * 2, 6), generator=g))
        for _ in range(3)
    ]

    def loss_fn(out, y):
        return F.cross_entropy(out.flatten(0, 1), y.flatten())

    _check_ddp(rank, world, _TinyTransformer.make, batches, loss_fn, momentum=0.0)


def _section_rank_numbers(rank, world):
    """Collectives of values made from Python numbers that differ by rank, recorded into
    one program with them (Note [Numbers of multi-process programs] in lazytpu/engine_flush.py):
    compiled in as constants, XLA folded the all-gather into rank 0's value everywhere."""
    import torch
    import torch.distributed as dist
    from torch.testing import assert_close

    for _ in range(3):  # a first program, then the same structure again (specialized or lifted)
        mine = torch.full((2,), float(rank), device="tpu") * (rank + 2) + 0.5 * rank
        gathered = torch.empty(2 * world, device="tpu")
        dist.all_gather_into_tensor(gathered, mine)
        total = torch.ones(3, device="tpu") * (rank + 1)
        dist.all_reduce(total)
        expect = torch.tensor([r * (r + 2) + 0.5 * r for r in range(world)]).repeat_interleave(2)
        assert_close(gathered.cpu(), expect)
        assert_close(total.cpu(), torch.full((3,), float(sum(r + 1 for r in range(world)))))


def _section_dropped_collective(rank, world):
    """A rank drops an in-graph collective's result that another keeps, then both
    enter a host (gloo) collective: the dropped one still runs, before the host
    one (Note [Runner effects] in lazytpu/engine.py, Note [Device collectives before
    host ones]); it was discarded as dead work and rank 0 waited in it forever."""
    import torch
    import torch.distributed as dist
    from torch.testing import assert_close

    for _ in range(2):
        gathered = torch.empty(2 * world, device="tpu")
        dist.all_gather_into_tensor(gathered, torch.full((2,), float(rank), device="tpu") + 1)
        if rank != 0:
            del gathered  # as FSDP2's full state dict with cpu_offload does on ranks > 0
        flag = torch.tensor([rank + 5])
        dist.broadcast(flag, src=0)  # a CPU tensor: the group's gloo helper
        assert flag.item() == 5
        if rank == 0:
            assert_close(gathered.cpu(), torch.arange(1.0, world + 1).repeat_interleave(2))


def _section_in_graph(rank, world):
    """Defer mode: a DDP step (forward, backward, gradient all-reduce, SGD) is
    the same programs every step, with no sync at the collective; a rank that cuts its
    step differently (rank 0 reads the loss mid-step) still agrees."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.testing import assert_close

    from lazytpu import _config, metrics

    model = _tiny_mlp()
    reference = copy.deepcopy(model)
    ddp = DDP(model.to("tpu"))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(world * 4, 8, generator=g), torch.randn(world * 4, 4, generator=g)) for _ in range(6)]
    for step, (x, y) in enumerate(batches):
        if step == 2:
            torch.tpu.synchronize()
            metrics.reset()
        opt.zero_grad()
        loss = F.mse_loss(ddp(x[rank * 4 : rank * 4 + 4].to("tpu")), y[rank * 4 : rank * 4 + 4].to("tpu"))
        loss.backward()
        if step == 5 and rank == 0:
            loss.item()  # this rank's step is two programs, the other's one
        opt.step()
        ref_opt.zero_grad()
        F.mse_loss(reference(x), y).backward()
        ref_opt.step()
    torch.tpu.synchronize()  # the last step's program waits for the next op or sync (Note [Step boundary])
    snap = metrics.snapshot()
    assert "collective" not in snap["syncs"], snap["syncs"]
    if _config.STEP_SEGMENTS.get():  # each step three programs (Note [Step segments]); rank 0's item() cuts
        assert snap["programs_executed"] == 4 * 3, snap  # the backward's segment, as rank 1's update does
    else:  # steps 2..4: one program each; step 5: two on rank 0 (the item() cut)
        assert snap["programs_executed"] == (5 if rank == 0 else 4), snap
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_close(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5)
    # A rank that enters a host collective right after its step records no op first: the step's
    # program (with the in-graph all-reduce) must be dispatched at the step (Note [Step boundary]),
    # or rank 0's read below waits for it while rank 1 waits in the barrier.
    x, y = batches[0]
    opt.zero_grad()
    F.mse_loss(ddp(x[rank * 4 : rank * 4 + 4].to("tpu")), y[rank * 4 : rank * 4 + 4].to("tpu")).backward()
    opt.step()
    if rank == 0:
        next(model.parameters()).detach().cpu()
    torch.distributed.barrier()


def _section_ddp_unsupported_options(rank, world):
    """find_unused_parameters / static_graph need a pinned allocator (Note [DDP
    and pinned memory]): DDP raises at construction on every rank, naming the
    option, and the ranks stay in step (a plain DDP model still trains)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    for option in ("find_unused_parameters", "static_graph"):
        try:
            DDP(_tiny_mlp().to("tpu"), **{option: True})
        except NotImplementedError as exc:
            assert f"{option}=True" in str(exc) and "pinned" in str(exc), exc
        else:
            raise AssertionError(f"DDP({option}=True) did not raise")
    cpu = DDP(_tiny_mlp(), find_unused_parameters=True)  # CPU modules (gloo's side) are not refused
    assert cpu.find_unused_parameters
    ddp = DDP(_tiny_mlp().to("tpu"))
    F.mse_loss(ddp(torch.ones(2, 8, device="tpu")), torch.zeros(2, 4, device="tpu")).backward()
    assert ddp.module[0].weight.grad is not None


def _section_dead_rank(rank, world):
    import torch
    import torch.distributed as dist

    t = torch.ones(2, device="tpu")
    dist.all_reduce(t)
    t.cpu()
    if rank == 1:
        os._exit(3)  # dies without a word
    try:
        for _ in range(20):
            time.sleep(0.5)
            t = torch.ones(2, device="tpu")
            dist.all_reduce(t)
            t.cpu()
    except Exception as exc:  # the transport notices the lost peer
        print(f"survivor saw: {type(exc).__name__}: {exc}", flush=True)
        print("OK dead_rank", flush=True)
        os._exit(0)  # JAX's shutdown would wait for the dead rank
    raise AssertionError("the survivor never noticed the dead rank")


def _section_hang(rank, world):
    import torch
    import torch.distributed as dist

    if rank == 1:
        while True:  # hangs; its watchdog must end it
            time.sleep(1)
    t = torch.ones(2, device="tpu")
    dist.all_reduce(t)
    t.cpu()


def _section_init_too_late(rank, world):
    import torch
    import torch.distributed as dist

    torch.ones(2, device="tpu").cpu()  # JAX's devices exist now
    try:  # rank 0 of 2 with a local store: fails before any rendezvous
        dist.init_process_group(backend="tpu_dist", store=dist.HashStore(), rank=0, world_size=2)
    except RuntimeError as exc:
        assert "before the first tpu tensor" in str(exc), exc
    else:
        raise AssertionError("init_process_group did not fail")


def _section_four_ranks(rank, world):
    import torch
    import torch.distributed as dist
    from torch.testing import assert_close

    assert world == 4
    t = _mine(rank).to("tpu")
    dist.all_reduce(t)
    assert_close(t.cpu(), sum(_mine(r) for r in range(world)))
    odd = dist.new_group([1, 3])  # every rank creates it; only members use it
    if rank in (1, 3):
        t = _mine(rank).to("tpu")
        dist.all_reduce(t, group=odd)
        assert_close(t.cpu(), _mine(1) + _mine(3))
    t = _mine(rank).to("tpu")  # point to point between two of four processes
    if rank == 2:
        dist.send(t, dst=0)
    elif rank == 0:
        dist.recv(t, src=2)
        assert_close(t.cpu(), _mine(2))
    out = torch.empty(2, device="tpu")
    dist.reduce_scatter_tensor(out, _mine(rank, (2 * world,)).to("tpu"))
    assert_close(out.cpu(), sum(_mine(r, (2 * world,)) for r in range(world))[2 * rank : 2 * rank + 2])


def _section_placement(rank, world):
    import jax
    import torch

    for index in range(3):  # the same program on three devices (of a device buffer: Note [Constant reads])
        y = torch.arange(4.0).to(f"tpu:{index}") * 3
        y.cpu()
        assert y._lt_storage.value.buffer.devices() == {jax.local_devices()[index]}, (index, y._lt_storage.value)


def _section_devices(rank, world):
    import torch
    from torch.testing import assert_close

    assert torch.tpu.device_count() == 8, torch.tpu.device_count()
    for index in (1, 7):
        x = torch.arange(6.0, device=f"tpu:{index}").reshape(2, 3)
        y = (x * 2 + 1).sum(0)
        assert y.device == torch.device("tpu", index)
        assert_close(y.cpu(), (torch.arange(6.0).reshape(2, 3) * 2 + 1).sum(0))
    # a tensor's device is its storage's (Note [Device index]): ``.data`` from another device moves it,
    # and a view taken before stays on the old storage's device
    t = torch.zeros(3, device="tpu:1")
    v = t[1:]
    t.data = torch.ones(3, device="tpu:7")
    assert t.device == (t + 1).device == torch.device("tpu", 7) and v.device == (v + 1).device == torch.device("tpu", 1)
    assert_close((t + 1).cpu(), torch.full((3,), 2.0))
    assert_close((v + 1).cpu(), torch.ones(2))


def _section_current_device(rank, world):
    import threading

    import torch

    tpu = torch.tpu
    with tpu.device(2):
        assert torch.ones(2, device="tpu").device == torch.device("tpu", 2)  # it was tpu:0
        with torch.device("tpu"):
            assert torch.zeros(3).device == torch.device("tpu", 2)
        assert tpu.get_device_properties().index == 2
    seen = []
    worker = threading.Thread(target=lambda: (seen.append(tpu.current_device()), tpu.set_device(5)))
    worker.start()
    worker.join()
    assert seen == [0] and tpu.current_device() == 0  # per thread (it was one for the process)
    torch.accelerator.set_device_index(3)  # torch.accelerator's device index did nothing
    assert tpu.current_device() == torch.accelerator.current_device_index() == 3
    with torch.accelerator.device_index(6):
        assert tpu.current_device() == 6 and torch.randn(2, device="tpu").device.index == 6
    assert tpu.current_device() == 3
    tpu.set_device(0)
    stream = tpu.Stream(device="tpu:4")
    with tpu.stream(stream):  # a stream of another device makes its device current, as CUDA's
        assert tpu.current_device() == 4 and tpu.current_stream() == stream
    assert tpu.current_device() == 0 and tpu.current_stream() == tpu.default_stream()
    tpu.set_stream(stream)
    assert tpu.current_device() == 4
    tpu.set_stream(tpu.default_stream(0))
    assert tpu.current_device() == 0
    event, other = stream.record_event(), stream.record_event()
    assert event.device == torch.device("tpu", 4) and 0 < event.event_id != other.event_id
    # a generator of one device serves an op on another (CUDA checks only its type): the same numbers
    g = torch.Generator(device="tpu:3").manual_seed(11)
    expected = torch.randn(4, device="tpu:3", generator=torch.Generator(device="tpu:3").manual_seed(11)).cpu()
    assert torch.equal(torch.randn(4, device="tpu:1", generator=g).cpu(), expected)
    assert torch.randn(4, device="tpu:3", generator=g).device.index == 3
    states = tpu.get_rng_state_all()
    assert len(states) == 8
    first = torch.rand(3, device="tpu:5").cpu()
    tpu.set_rng_state_all(states)
    assert torch.equal(torch.rand(3, device="tpu:5").cpu(), first)
    seed = tpu.seed_all()
    assert tpu.initial_seed() == seed and tpu.init() is None


def _section_local_mesh(rank, world):
    import torch
    from torch.testing import assert_close

    from lazytpu.distributed import LocalMesh

    x = torch.arange(6.0, device="tpu:1").reshape(2, 3)
    y = (x * 2).to("tpu:2")  # tpu:1 -> tpu:2
    assert y.device == torch.device("tpu", 2)
    assert_close(y.cpu(), torch.arange(6.0).reshape(2, 3) * 2)
    assert x.t().to("tpu:3", dtype=torch.float64).device == torch.device("tpu", 3)  # a view, and a cast
    assert_close(x.t().to("tpu:3", dtype=torch.float64).cpu(), torch.arange(6.0, dtype=torch.float64).reshape(2, 3).t())
    z = torch.zeros(2, 3, device="tpu:4")
    z.copy_(y)  # tpu:2 -> tpu:4
    assert_close((z + 1).cpu(), torch.arange(6.0).reshape(2, 3) * 2 + 1)
    try:  # one op on two devices: torch's error, not a silent result on one of them
        x + y
    except RuntimeError as exc:
        assert "Expected all tensors to be on the same device" in str(exc) and "tpu:2" in str(exc), exc
    else:
        raise AssertionError("an op mixing tpu:1 and tpu:2 did not raise")

    mesh = LocalMesh(4)
    assert mesh.size() == 4 and mesh.devices[3] == torch.device("tpu", 3)
    parts = [(torch.arange(3.0) + 10 * i).to(f"tpu:{i}") * 1 for i in range(4)]  # pending on each device
    mesh.all_reduce_(parts, op="avg")
    for i, t in enumerate(parts):
        assert t.device == torch.device("tpu", i)
        assert_close(t.cpu(), torch.arange(3.0) + 15)
    parts = [torch.full((2,), float(i), device=f"tpu:{i}") for i in range(4)]
    mesh.broadcast_(parts, src=2)
    assert all(torch.equal(t.cpu(), torch.full((2,), 2.0)) for t in parts)
    chunks = mesh.scatter(torch.arange(8.0))
    assert [c.device.index for c in chunks] == [0, 1, 2, 3]
    assert_close(chunks[3].cpu(), torch.tensor([6.0, 7.0]))
    try:
        mesh.all_reduce_(parts[:3])
    except ValueError as exc:
        assert "one tensor per device" in str(exc), exc
    else:
        raise AssertionError("a short list was accepted")


JOBS = {
    "defer": Job(
        {"TORCHTPU_EAGER_MODE": "defer"},
        [
            _section_coordinator_bind,
            _section_collectives,
            _section_functional,
            _section_ddp_mlp,
            _section_ddp_transformer,
            _section_in_graph,
            _section_rank_numbers,
            _section_dropped_collective,
            _section_ddp_unsupported_options,
        ],
    ),
    "strict": Job(
        {"TORCHTPU_EAGER_MODE": "strict", "DIST_TEST_HEARTBEAT_S": "5"},
        [_section_mixed, _section_strict_collectives, _section_dead_rank],
        backend="cpu:gloo,tpu:tpu",
    ),
    "four": Job({}, [_section_four_ranks], world=4),
    "hang": Job({"DIST_TEST_WATCHDOG_S": "12"}, [_section_hang]),
    "init_too_late": Job({}, [_section_init_too_late], backend=None),
    "devices": Job(
        {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"},
        [_section_devices, _section_placement, _section_local_mesh, _section_current_device],
        backend=None,
    ),
}
HARNESS = Harness(__file__, JOBS)
run_job, assert_section, assert_alone = HARNESS.run_job, HARNESS.assert_section, HARNESS.assert_alone


if __name__ == "__main__":
    HARNESS.main()
