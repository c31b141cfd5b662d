"""DeviceMesh, DTensor and tensor parallelism on ``tpu``: real processes on 127.0.0.1.

Ranks of this file run as scripts (``python test_dtensor.py JOB``, through
tests/dist_harness.py); each section checks its results against CPU torch
(the full tensor, or the same model trained in one process) and prints ``OK
<section>``. DTensor's collectives are ``_c10d_functional`` ops on the mesh's
groups, recorded into the pending program (Note [In-graph collectives] and
Note [Subgroups in the world mesh] in lazytpu/distributed/ingraph.py): the
sections count programs and assert no collective cut one.
"""

from __future__ import annotations

import copy
import itertools

from dist_harness import Harness, Job, report, tiny_llama

# -- the tests ----------------------------------------------------------------------------
# One launch per world size (starting ranks costs ~15 s on 2 cores).


def test_redistribute_every_pair_on_a_1d_mesh():
    assert_section("two", "redistribute_1d")


def test_from_local_to_local_full_tensor():
    assert_section("two", "from_local")


def test_dtensor_training_step_matches_cpu_in_one_program_per_segment():
    assert_section("two", "training_step")


def test_mesh_errors_are_torchs_at_the_call():
    assert_section("two", "errors")


def test_llama_tensor_parallel_matches_one_device():
    assert_section("two", "llama_tp")


def test_llama_sequence_parallel_matches_one_device():
    assert_section("two", "llama_sp")


def test_redistribute_every_pair_on_a_2d_mesh():
    assert_section("four", "redistribute_2d")


def test_fsdp_times_tensor_parallel_on_a_2x2_mesh():
    assert_section("four", "fsdp_tp")


def test_world_mesh_of_device_mesh_groups():
    """Which groups of a world are axes of one mesh (Note [Subgroups in the world mesh])."""
    from lazytpu.distributed import jax_runtime as jr

    assert jr.line((0, 2), 4) == (2, 2) and jr.line((1, 3), 4) == (2, 2)  # a 2x2 mesh's columns
    assert jr.line((2, 3), 4) == (1, 2) and jr.line((0, 1, 2, 3), 4) == (1, 4)  # a row; the world
    assert jr.line((0, 3), 4) is None and jr.line((1, 2), 4) is None and jr.line((0,), 4) is None
    assert jr.line((0, 2, 4), 6) == (2, 3) and jr.line((0, 2), 6) is None  # stride 2, size 2 does not tile 6
    assert jr.merge_cuts((), (2, 2), 4) == (1, 2, 4) and jr.merge_cuts((1, 2, 4), (1, 2), 4) == (1, 2, 4)
    assert jr.merge_cuts((), (1, 1), 1) == (1,)
    assert jr.merge_cuts((1, 3, 6), (2, 3), 6) is None  # a (2, 3) mesh's rows and a (3, 2) mesh's: no one mesh
    names, sizes = ("stride2", "stride1"), (2, 2)
    assert jr.group_axes(names, sizes, (2, 2)) == ("stride2",) and jr.group_axes(names, sizes, (1, 2)) == ("stride1",)
    assert jr.group_axes(names, sizes, (1, 4)) == ("stride2", "stride1")


def test_jobs_exit_cleanly():
    for job in JOBS:
        results = HARNESS.run_job(job)
        assert all(code == 0 for code, _ in results), report(results)


# -- helpers (in the ranks) -------------------------------------------------------------


def _close(actual, expected, what: str, **tolerance) -> None:
    """``assert_close``, its message prefixed with ``what``."""
    from torch.testing import assert_close

    try:
        assert_close(actual, expected, **tolerance)
    except AssertionError as exc:
        raise AssertionError(f"{what}: {exc}") from None


def _expected_local(full, mesh, placements):
    """This rank's part of ``full`` under ``placements`` (Shard and Replicate),
    by torch.chunk along each sharded mesh dimension in order."""
    import torch
    from torch.distributed.tensor import Shard

    coord = mesh.get_coordinate()
    local = full
    for dim, p in enumerate(placements):
        if isinstance(p, Shard):
            chunks = torch.chunk(local, mesh.size(dim), dim=p.dim)
            if coord[dim] < len(chunks):
                local = chunks[coord[dim]]
            else:
                shape = list(local.shape)
                shape[p.dim] = 0
                local = local.new_empty(shape)
    return local


def _partial_local(full, mesh, placements):
    """A local tensor for ``placements`` (Partial sums allowed): the shard of
    ``full``, weighted so that summing over each Partial dimension gives it."""
    from torch.distributed.tensor import Partial

    local = _expected_local(full, mesh, placements)
    coord = mesh.get_coordinate()
    for dim, p in enumerate(placements):
        if isinstance(p, Partial):
            n = mesh.size(dim)
            local = local * ((coord[dim] + 1) / (n * (n + 1) / 2))
    return local


def _placements(ndim_mesh):
    """Every placement of a 1-d mesh; on a 2-d mesh, six in which each mesh
    dimension takes each kind (Shard(0), Shard(1), Replicate, Partial) and a
    tensor dimension is sharded over both, so their pairs move each kind to
    each other kind on each mesh dimension (the 256 pairs of all 16 would
    cost minutes of compiling on a small CI machine)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    if ndim_mesh == 1:
        return [(Shard(0),), (Shard(1),), (Replicate(),), (Partial(),)]
    return [
        (Shard(0), Shard(1)),
        (Shard(1), Shard(0)),
        (Replicate(), Partial()),
        (Partial(), Replicate()),
        (Shard(0), Shard(0)),
        (Replicate(), Replicate()),
    ]


def _check_redistributes(mesh, shape):
    """Every pair of placements: from_local(src) -> redistribute(dst), the
    local tensor and the full tensor equal CPU torch's; all in one program."""
    import torch
    from torch.distributed.tensor import DTensor, Partial
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._redistribute import redistribute_local_tensor

    from lazytpu import metrics

    g = torch.Generator().manual_seed(7)
    full = torch.randn(*shape, generator=g)
    placements = _placements(mesh.ndim)
    torch.tpu.synchronize()
    metrics.reset()
    results = []
    for src, dst in itertools.product(placements, placements):
        local = _partial_local(full, mesh, src).to("tpu")
        d = DTensor.from_local(local, mesh, src, run_check=False, shape=full.shape, stride=full.stride())
        if any(p.is_partial() and p != q for p, q in zip(dst, src)):
            try:  # torch's rule, as on CPU: to Partial is for its own use
                d.redistribute(mesh, dst)
            except RuntimeError as exc:
                assert "redistributing to Partial is for internal use only" in str(exc), exc
            else:
                raise AssertionError(f"{src} -> {dst} was allowed")
            if any(p.is_partial() and p != q and not q.is_replicate() for p, q in zip(dst, src)):
                continue  # Shard -> Partial: torch has no such redistribute, even internally
            spec = DTensorSpec(mesh, tuple(dst), tensor_meta=d._spec.tensor_meta)
            moved = redistribute_local_tensor(d.to_local(), d._spec, spec)  # Replicate -> Partial: internal
            r = DTensor.from_local(moved, mesh, dst, run_check=False, shape=full.shape, stride=full.stride())
        else:
            r = d.redistribute(mesh, dst)
        assert r.placements == tuple(dst) and r.shape == full.shape, (src, dst, r)
        results.append((src, dst, r.to_local(), r.full_tensor()))
    torch.tpu.synchronize()
    snap = metrics.snapshot()
    # the uploads are no programs; the redistributes and gathers of all pairs are one
    # program (or a few, cut by the graph's size cap), none cut by a collective
    assert "collective" not in snap["syncs"], snap
    assert snap["programs_executed"] == sum(snap["syncs"].values()) <= 3, snap
    for src, dst, local, whole in results:
        _close(whole.cpu(), full, what=f"{src} -> {dst}")
        if not any(isinstance(p, Partial) for p in dst):
            _close(local.cpu(), _expected_local(full, mesh, dst), what=f"{src} -> {dst}")


# -- sections ---------------------------------------------------------------------------------


def _section_redistribute_1d(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("tpu", (world,))
    assert mesh.device_type == "tpu" and mesh.size() == world
    _check_redistributes(mesh, (5, 6))  # dim 0 uneven over 2 ranks


def _section_redistribute_2d(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("tpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    coordinate = mesh.get_coordinate()
    assert mesh["tp"].size() == world // 2 and list(coordinate) == [rank // 2, rank % 2], (mesh, coordinate)
    _check_redistributes(mesh, (6, 4))


def _section_from_local(rank, world):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    from torch.testing import assert_close

    mesh = init_device_mesh("tpu", (world,))
    full = torch.arange(24.0).reshape(4, 6)
    local = full[:, rank * 3 : rank * 3 + 3].to("tpu")
    d = DTensor.from_local(local, mesh, [Shard(1)])  # run_check: a broadcast from rank 0
    assert d.shape == (4, 6) and d.device.type == "tpu" and d.to_local().shape == (4, 3)
    assert_close(d.full_tensor().cpu(), full)
    # ops on DTensors, then back to a plain tensor
    e = (d * 2 + 1).sum(dim=1)  # Shard(1) summed over dim 1: Partial
    assert e.placements[0].is_partial(), e.placements
    assert_close(e.full_tensor().cpu(), (full * 2 + 1).sum(dim=1))
    s = (d * 2).sum()
    assert_close(s.full_tensor().cpu(), (full * 2).sum())
    r = distribute_tensor(full.to("tpu"), mesh, [Replicate()])
    assert_close((r @ d.redistribute(mesh, [Replicate()]).T).full_tensor().cpu(), full @ full.T)
    # a sharded matmul: (4,6) Shard(1) @ (6,4) Shard(0) is Partial
    w = distribute_tensor(full.T.contiguous().to("tpu"), mesh, [Shard(0)])
    out = d @ w
    assert out.placements[0].is_partial(), out.placements
    assert_close(out.full_tensor().cpu(), full @ full.T)


def _mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _section_training_step(rank, world):
    """Linear layers sharded by hand (distribute_module: the first column-,
    the second row-wise), AdamW; the parameters equal CPU training's, and the
    steady step is the programs of a one-device step (no collective cuts)."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
    from torch.testing import assert_close

    from lazytpu import _config, metrics

    mesh = init_device_mesh("tpu", (world,))
    model = _mlp()
    reference = copy.deepcopy(model)

    def partition(name, module, mesh):
        if name == "0":
            for pname, p in module.named_parameters(recurse=False):
                module.register_parameter(pname, torch.nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])))
        elif name == "2":
            module.weight = torch.nn.Parameter(distribute_tensor(module.weight, mesh, [Shard(1)]))
            module.bias = torch.nn.Parameter(distribute_tensor(module.bias, mesh, [Replicate()]))

    def input_fn(module, inputs, mesh):
        return tuple(distribute_tensor(x, mesh, [Replicate()]) for x in inputs)

    def output_fn(module, out, mesh):
        return out.redistribute(mesh, [Replicate()]).to_local()

    model = distribute_module(model.to("tpu"), mesh, partition, input_fn, output_fn)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)) for _ in range(5)]
    for step, (x, y) in enumerate(batches):
        if step == 2:
            torch.tpu.synchronize()
            metrics.reset()
        opt.zero_grad()
        loss = F.mse_loss(model(x.to("tpu")), y.to("tpu"))
        loss.backward()
        opt.step()
        ref_opt.zero_grad()
        ref_loss = F.mse_loss(reference(x), y)
        ref_loss.backward()
        ref_opt.step()
    torch.tpu.synchronize()
    snap = metrics.snapshot()
    assert "collective" not in snap["syncs"], snap["syncs"]
    per_step = 3 if _config.STEP_SEGMENTS.get() else 1  # Note [Step segments]
    assert snap["programs_executed"] == 3 * per_step, snap
    assert_close(loss.detach().cpu(), ref_loss.detach(), rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        _close(p.full_tensor().cpu(), q.detach(), rtol=1e-4, atol=1e-5, what=name)


def _raises(kind, match: str, fn) -> None:
    try:
        fn()
    except kind as exc:
        assert match in str(exc), exc
    else:
        raise AssertionError(f"no {kind.__name__} ({match!r})")


def _section_errors(rank, world):
    """Item 8: torch's errors, raised at the call, for a mesh over more ranks
    than exist, meshes mixed in one op, placements DTensor does not support;
    and every Partial reduce op it does support, against CPU."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    _raises(
        RuntimeError,
        "Mesh should not be bigger than default world size 2, but found 8 ranks",
        lambda: init_device_mesh("tpu", (8,)),
    )
    _raises(RuntimeError, "but found 4 ranks", lambda: init_device_mesh("tpu", (2, 2)))
    mesh = init_device_mesh("tpu", (world,))
    cpu_mesh = init_device_mesh("cpu", (world,))  # the tpu_dist group serves CPU tensors through gloo
    full = torch.arange(12.0).reshape(3, 4)
    a = distribute_tensor(full.to("tpu"), mesh, [Replicate()])
    b = distribute_tensor(full, cpu_mesh, [Replicate()])
    assert b.device.type == "cpu" and a.device.type == "tpu"
    _raises(RuntimeError, "Expected all tensors to be on the same device", lambda: a @ b.T)
    named = init_device_mesh("tpu", (world,), mesh_dim_names=("tp",))  # the same ranks, another mesh
    c = distribute_tensor(full.to("tpu"), named, [Replicate()])
    _raises(RuntimeError, "Cannot run aten.mm.default on inputs with different meshes", lambda: a @ c.T)
    _raises(RuntimeError, "Expected all tensors to be on the same device", lambda: a + b)
    _raises(RuntimeError, "got mixed torch.Tensor and DTensor", lambda: a + full.to("tpu"))
    _raises(
        AssertionError,
        "Sharding dim 5 greater than tensor ndim 2",
        lambda: distribute_tensor(full.to("tpu"), mesh, [Shard(5)]),
    )
    _raises(
        ValueError,
        "must have the same length as `device_mesh.ndim`",
        lambda: distribute_tensor(full.to("tpu"), mesh, [Shard(0), Shard(1)]),
    )
    _raises(
        RuntimeError, "redistributing to Partial is for internal use only", lambda: a.redistribute(mesh, [Partial()])
    )
    # every reduce op of Partial: to Replicate and to Shard(0), against CPU
    parts = [torch.tensor([1.0, -2.0, 3.0, 0.5]) * (r + 2) for r in range(world)]
    expected = {
        "sum": sum(parts),
        "avg": sum(parts) / world,
        "max": torch.stack(parts).amax(0),
        "min": torch.stack(parts).amin(0),
        "product": torch.stack(parts).prod(0),
    }
    for op, want in expected.items():
        d = DTensor.from_local(parts[rank].to("tpu"), mesh, [Partial(op)], run_check=False)
        _close(d.redistribute(mesh, [Replicate()]).to_local().cpu(), want, what=op)
        _close(d.redistribute(mesh, [Shard(0)]).full_tensor().cpu(), want, what=op)
    ints = DTensor.from_local(torch.arange(4, device="tpu") + rank, mesh, [Partial()], run_check=False)
    assert torch.equal(ints.full_tensor().cpu(), sum(torch.arange(4) + r for r in range(world)))


def _llama():
    return tiny_llama(attn_implementation="sdpa")


def _tp_plan(sequence_parallel: bool):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    layer = "model.layers.*."
    plan = {layer + f"self_attn.{p}_proj": ColwiseParallel() for p in "qkv"}
    plan.update({layer + f"mlp.{p}_proj": ColwiseParallel() for p in ("gate", "up")})
    if not sequence_parallel:
        plan[layer + "self_attn.o_proj"] = RowwiseParallel()
        plan[layer + "mlp.down_proj"] = RowwiseParallel()
        return plan
    plan.update(
        {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            layer + "input_layernorm": SequenceParallel(),
            layer + "self_attn": PrepareModuleInput(
                input_kwarg_layouts={"hidden_states": Shard(1)},
                desired_input_kwarg_layouts={"hidden_states": Replicate()},
            ),
            layer + "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            layer + "post_attention_layernorm": SequenceParallel(),
            layer + "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            layer + "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
            "model.norm": SequenceParallel(),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        }
    )
    return plan


def _check_llama_tp(mesh, sequence_parallel: bool, steps: int = 2):
    """The Llama under the TP plan on tpu against the same model on CPU:
    logits, and the parameters after ``steps`` SGD steps."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module
    from torch.testing import assert_close

    from lazytpu import _config, metrics

    reference = _llama()
    model = parallelize_module(copy.deepcopy(reference).to("tpu"), mesh, _tp_plan(sequence_parallel))
    # foreach=False: the plan leaves some parameters plain tensors, and a foreach
    # op cannot mix them with DTensors (torch's error, as on CPU)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 256, (2, 8), generator=g)
    positions = torch.arange(8).expand(2, 8)
    for step in range(steps):  # the same programs each step: the last is measured
        if step == steps - 1:
            torch.tpu.synchronize()
            metrics.reset()
        logits = model(tokens.to("tpu"), position_ids=positions.to("tpu")).logits
        ref_logits = reference(tokens, position_ids=positions).logits
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten().to("tpu")).backward()
        F.cross_entropy(ref_logits.flatten(0, 1), tokens.flatten()).backward()
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    torch.tpu.synchronize()
    snap = metrics.snapshot()
    # the TP collectives are in the step's programs: as many as a one-device step's
    assert "collective" not in snap["syncs"], snap
    assert snap["programs_executed"] == (3 if _config.STEP_SEGMENTS.get() else 1), snap  # Note [Step segments]
    local = logits.to_local() if isinstance(logits, DTensor) else logits  # the last step's, computed by it
    assert_close(local.detach().cpu(), ref_logits.detach(), rtol=1e-4, atol=1e-4)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        value = p.full_tensor() if isinstance(p, DTensor) else p
        _close(value.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5, what=name)


def _section_llama_tp(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("tpu", (world,))
    _check_llama_tp(mesh, sequence_parallel=False)


def _section_llama_sp(rank, world):
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("tpu", (world,))
    _check_llama_tp(mesh, sequence_parallel=True)


def _section_fsdp_tp(rank, world):
    """FSDP x TP on a 2x2 mesh: the Llama's TP plan over ``tp``, fully_shard
    over ``dp`` (each dp rank its half of the batch); the parameters after
    SGD steps equal one-device training on the whole batch, and a step is the
    programs of a one-device step."""
    import torch
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from lazytpu import _config, metrics

    mesh = init_device_mesh("tpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    dp = mesh.get_coordinate()[0]
    reference = _llama()
    model = parallelize_module(copy.deepcopy(reference).to("tpu"), mesh["tp"], _tp_plan(sequence_parallel=False))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)  # one step's programs serve every step
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(5)
    for step in range(2):
        if step == 1:
            torch.tpu.synchronize()
            metrics.reset()
        tokens = torch.randint(0, 256, (4, 8), generator=g)
        mine = tokens[2 * dp : 2 * dp + 2]
        logits = model(mine.to("tpu")).logits
        F.cross_entropy(logits.flatten(0, 1), mine.flatten().to("tpu")).backward()
        opt.step()
        opt.zero_grad()
        ref_logits = reference(tokens).logits
        F.cross_entropy(ref_logits.flatten(0, 1), tokens.flatten()).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    torch.tpu.synchronize()
    snap = metrics.snapshot()
    assert "collective" not in snap["syncs"], snap  # FSDP's over dp and TP's over tp: in-graph
    assert snap["programs_executed"] == (3 if _config.STEP_SEGMENTS.get() else 1), snap
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        _close(p.full_tensor().detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5, what=name)


# Four ranks compiling a Llama on 2 loaded cores can take minutes: the watchdogs are wider.
_SLOW = {"TORCHTPU_EAGER_MODE": "defer", "DIST_TEST_WATCHDOG_S": "240"}
JOBS = {
    "two": Job(
        _SLOW,
        [
            _section_redistribute_1d,
            _section_from_local,
            _section_training_step,
            _section_errors,
            _section_llama_tp,
            _section_llama_sp,
        ],
        timeout=300,
    ),
    "four": Job(_SLOW, [_section_redistribute_2d, _section_fsdp_tp], world=4, timeout=300),
}
HARNESS = Harness(__file__, JOBS)
assert_section = HARNESS.assert_section


if __name__ == "__main__":
    HARNESS.main()
