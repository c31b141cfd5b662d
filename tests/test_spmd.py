"""One process, four devices: a model sharded over a ``LocalMesh``, each step
one SPMD program over the mesh (Note [Sharded tensors] in
lazytpu.distributed.spmd, Note [SPMD programs] in lazytpu.runtime.executor).

The sections run in one process of this file (``python test_spmd.py spmd``)
with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``; each compares its
training with CPU torch's and prints ``OK <section>``.
"""

from __future__ import annotations

from dist_harness import Harness, Job, tiny_llama

DEVICES = 4


def test_mlp_trains_as_one_program_per_step_with_sharded_state():
    HARNESS.assert_alone("spmd", "mlp")


def test_llama_trains_sharded_as_on_one_device():
    HARNESS.assert_alone("spmd", "llama")


def test_unsharded_programs_stay_on_their_device():
    HARNESS.assert_alone("spmd", "mixed")


def test_bad_mesh_and_placements_raise():
    HARNESS.assert_alone("spmd", "errors")


# -- the sections (run in the job's process) ----------------------------------------------


def _train(model, opt, batches, step):
    """Run ``step(model, batch)`` + AdamW on each batch; the losses, and the
    metrics of each step (compiled, executed programs)."""
    from lazytpu import metrics

    losses, counts = [], []
    for batch in batches:
        before = metrics.snapshot()
        loss = step(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach().cpu())
        after = metrics.snapshot()
        counts.append(tuple(after[k] - before[k] for k in ("programs_compiled", "programs_executed")))
    return losses, counts


def _check_sharded(model, opt):
    """Every parameter and its AdamW state stay Shard(0) over the mesh."""
    from torch.distributed.tensor import Shard

    from lazytpu.distributed.spmd import placements

    for p in model.parameters():
        assert placements(p) == (Shard(0),), (p.shape, placements(p))
        for name in ("exp_avg", "exp_avg_sq"):
            assert placements(opt.state[p][name]) == (Shard(0),), (name, p.shape)


def _section_mlp(rank, world):
    import copy

    import torch
    from torch.distributed.tensor import Replicate, Shard
    from torch.testing import assert_close

    from lazytpu import _config
    from lazytpu.distributed import LocalMesh
    from lazytpu.distributed.spmd import placements

    torch.manual_seed(0)
    ref = torch.nn.Sequential(
        torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 16)
    )
    batches = [(torch.randn(16, 32), torch.randn(16, 16)) for _ in range(6)]
    mesh = LocalMesh(DEVICES)
    model = mesh.shard_module(copy.deepcopy(ref))
    before = [torch.tpu.memory_allocated(i) for i in range(DEVICES)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1)

    def step(m, batch):
        x, y = batch
        return torch.nn.functional.mse_loss(m(x), y)

    with _config.STEP_SEGMENTS.override(False):  # one program per step (Note [Step segments])
        losses, counts = _train(model, opt, [tuple(map(mesh.shard_batch, b)) for b in batches], step)
    ref_losses, _ = _train(ref, ref_opt, batches, step)
    assert_close(torch.stack(losses), torch.stack(ref_losses), atol=1e-5, rtol=1e-5)
    for p, r in zip(model.parameters(), ref.parameters()):
        assert_close(p.cpu(), r.detach(), atol=1e-5, rtol=1e-5)
    assert counts[3:] == [(0, 1)] * 3, counts  # steady state: one program per step, none compiled
    _check_sharded(model, opt)
    x = mesh.shard_batch(batches[0][0])
    assert placements(model(x).sum()) == (Replicate(),)  # computed by a program over the mesh
    batches = [tuple(map(mesh.shard_batch, b)) for b in batches]

    # each device holds a quarter of the parameters, of AdamW's two moments and of the gradients
    params = sum(p.numel() * p.element_size() for p in ref.parameters())
    held = [torch.tpu.memory_allocated(i) for i in range(DEVICES)]
    step(model, batches[0]).backward()  # Note [Sharded gradients]
    assert all(placements(p.grad) == (Shard(0),) for p in model.parameters())
    with_grads = [torch.tpu.memory_allocated(i) for i in range(DEVICES)]
    for i in range(DEVICES):
        for count, n in ((1, before[i]), (3, held[i]), (4, with_grads[i])):
            assert count * params / DEVICES <= n <= 1.05 * count * params / DEVICES, (i, count, n, params)


def _section_llama(rank, world):
    import copy

    import torch
    from torch.distributed.tensor import Shard
    from torch.testing import assert_close

    from lazytpu.distributed import LocalMesh
    from lazytpu.distributed.spmd import placements

    ref = tiny_llama()
    batches = [torch.randint(0, 256, (8, 16)) for _ in range(5)]
    mesh = LocalMesh(DEVICES)
    model = mesh.shard_module(copy.deepcopy(ref))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)

    def step(m, ids):
        return m(ids, labels=ids).loss

    losses, counts = _train(model, opt, [mesh.shard_batch(b) for b in batches], step)
    ref_losses, _ = _train(ref, ref_opt, batches, step)
    assert_close(torch.stack(losses), torch.stack(ref_losses), atol=1e-5, rtol=1e-5)
    for p, r in zip(model.parameters(), ref.parameters()):
        assert_close(p.cpu(), r.detach(), atol=1e-5, rtol=1e-5)
    assert counts[3:] == [(0, 3)] * 2, counts  # the step's three segments (Note [Step segments]), cached
    _check_sharded(model, opt)
    step(model, mesh.shard_batch(batches[0])).backward()
    assert all(placements(p.grad) == (Shard(0),) for p in model.parameters())  # Note [Sharded gradients]


def _section_mixed(rank, world):
    import torch
    from torch.distributed.tensor import Replicate, Shard
    from torch.testing import assert_close

    from lazytpu.distributed import LocalMesh
    from lazytpu.distributed.spmd import placements

    mesh = LocalMesh(DEVICES)
    a, b = torch.randn(8, 4), torch.randn(8, 4)
    sharded = mesh.shard(a)
    plain = b.to("tpu")
    assert sharded.shape == (8, 4) and sharded.device == torch.device("tpu", 0)
    assert placements(sharded) == (Shard(0),) and placements(plain) is None
    assert_close(sharded.cpu(), a)
    assert placements(plain * 2) is None  # no sharded input: a program of tpu:0 alone
    both = sharded @ plain.T + 1  # a single-device input, copied to the mesh
    assert placements(both) is not None
    assert_close(both.cpu(), a @ b.T + 1)
    replicated = mesh.shard(b, [Replicate()])
    assert placements(replicated) == (Replicate(),)
    assert placements(replicated + plain) is None  # a replicated input is read on tpu:0
    assert_close((replicated + plain).cpu(), 2 * b)
    column = mesh.shard(torch.arange(32.0).reshape(4, 8), [Shard(-1)])
    assert placements(column) == (Shard(1),)
    assert_close(column.sum(0).cpu(), torch.arange(32.0).reshape(4, 8).sum(0))
    on_two = torch.tpu.memory_allocated(1)
    del sharded, both, column
    assert torch.tpu.memory_allocated(1) < on_two  # shards are counted out on every device


def _section_errors(rank, world):
    import pytest
    import torch
    from torch.distributed.tensor import Partial, Replicate, Shard

    from lazytpu.distributed import LocalMesh

    with pytest.raises(ValueError, match="between 1 and 4"):
        LocalMesh(DEVICES + 1)
    mesh = LocalMesh(DEVICES)
    with pytest.raises(ValueError, match=r"dim 0 \(6\) is not divisible by the mesh size \(4\)"):
        mesh.shard(torch.zeros(6, 4))
    with pytest.raises(ValueError, match="only Shard"):
        mesh.shard(torch.zeros(8), [Partial()])
    with pytest.raises(ValueError, match="one Shard"):
        mesh.shard(torch.zeros(8), [Shard(0), Replicate()])
    with pytest.raises(ValueError, match="cannot Shard"):
        mesh.shard(torch.zeros(8), [Shard(1)])
    with pytest.raises(ValueError, match="a view"):
        mesh.shard(torch.zeros(8, 8, device="tpu")[2:6])


JOBS = {
    "spmd": Job(
        {"XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}", "DIST_TEST_WATCHDOG_S": "200"},
        [_section_mlp, _section_llama, _section_mixed, _section_errors],
        backend=None,
        timeout=240,
    ),
}
HARNESS = Harness(__file__, JOBS)


if __name__ == "__main__":
    HARNESS.main()
