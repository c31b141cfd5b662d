"""Distributed checkpoints (``torch.distributed.checkpoint``) of ``tpu`` tensors,
DTensors, DDP models and their optimizers: saved with 2 ranks, loaded with 2,
with 4 and in one process without a process group, where DCP reshards
(Note [Distributed checkpoints] in lazytpu/distributed/checkpoint.py).

Ranks run as in tests/test_distributed.py (tests/dist_harness.py); the 2-rank
job saves the checkpoints that the 4-rank job and this process load, under one
temporary folder passed to the ranks in the environment. Values are compared
with CPU torch: the tensors saved, and training resumed from a checkpoint
against uninterrupted single-process CPU training on the whole batch.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile

import torch
from dist_harness import Harness, Job
from torch import nn
from torch.testing import assert_close

_DIR_VAR = "LAZYTPU_TEST_DCP_DIR"
if _DIR_VAR in os.environ:  # a rank: the launcher's folder
    ROOT = os.environ[_DIR_VAR]
else:
    ROOT = tempfile.mkdtemp(prefix="lazytpu-dcp-")
    atexit.register(shutil.rmtree, ROOT, ignore_errors=True)


# -- the tests -----------------------------------------------------------------------------


def test_save_and_load_tensors_and_dtensors_with_two_ranks():
    assert_section("two", "tensors")


def test_ddp_model_and_adamw_resume_with_two_ranks():
    assert_section("two", "ddp")


def test_async_save_stages_tpu_tensors_and_dtensors():
    assert_section("two", "async_save")


def test_load_two_rank_tensors_with_four_ranks():
    assert_section("two", "tensors")
    assert_section("four", "reshard_tensors")


def test_fsdp2_model_and_adamw_resume_with_two_ranks():
    assert_section("two", "fsdp")


def test_fsdp2_checkpoint_of_two_ranks_resumes_with_four():
    assert_section("two", "fsdp")
    assert_section("four", "reshard_fsdp")


def test_load_two_rank_checkpoints_in_one_process():
    """``dcp.load`` with no process group: the DTensors saved by two ranks load
    whole into plain tpu tensors, and a plain model resumes the DDP and the
    FSDP2 training (AdamW state included) as CPU training."""
    import warnings

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    assert_section("two", "tensors")
    assert_section("two", "ddp")
    assert_section("two", "fsdp")
    assert not dist.is_initialized()
    expected = _saved_values()
    out = {k: torch.zeros_like(v, device="tpu") for k, v in expected.items() if isinstance(v, torch.Tensor)}
    out.update(step=0, name="")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        with _host_reads() as reads:
            dcp.load(out, checkpoint_id=os.path.join(ROOT, "tensors"))
        assert reads == [0]
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert out[key].device == torch.device("tpu", 0), key
                assert_close(out[key].cpu(), value, msg=key)
            else:
                assert out[key] == value, key
        for saved in ("ddp", "fsdp"):  # replicated, and sharded over 2 ranks
            model, opt = _model_and_optimizer(seed=1, device="tpu")
            msd, osd = get_state_dict(model, opt)
            state = {"model": msd, "optim": osd}
            dcp.load(state, checkpoint_id=os.path.join(ROOT, saved))
            set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            _train(model, opt, _BATCHES[2:], rank=0, world=1)
            _assert_trained_as_cpu(model, opt, steps=len(_BATCHES))


# -- the ranks' shared pieces -----------------------------------------------------------------


def assert_section(job: str, section: str):
    return HARNESS.assert_section(job, section)


@contextlib.contextmanager
def _host_reads():
    """Counts the device-to-host copies made in the block (``[count]``)."""
    from lazytpu import runtime

    original, counter = runtime.to_host, [0]

    def counted(buffer):
        counter[0] += 1
        return original(buffer)

    runtime.to_host = counted
    try:
        yield counter
    finally:
        runtime.to_host = original


def _saved_values() -> dict:
    """The values the ``tensors`` section saves (CPU): plain tensors of several
    dtypes, views, a value still pending at the save, DTensors, non-tensors."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    return {
        "f32": base,
        "column": base[:, 1],  # a non-contiguous view, saved with its base
        "transposed": base.t(),
        "pending": base * 2 + 1,  # computed by the save's one program
        "bf16": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "i64": torch.arange(10) * 7 - 3,
        "flag": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "shard0": torch.randn(8, 4, generator=g),  # DTensor, Shard(0)
        "shard1": torch.randn(3, 8, generator=g),  # DTensor, Shard(1)
        "repl": torch.randn(4, 4, generator=g),  # DTensor, Replicate()
        "step": 7,
        "name": "ckpt",
    }


_PLACEMENTS = {"shard0": "Shard(0)", "shard1": "Shard(1)", "repl": "Replicate()"}


def _placement(text: str):
    from torch.distributed.tensor import Replicate, Shard

    return eval(text, {"Shard": Shard, "Replicate": Replicate})


def _mesh(world: int):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("tpu", (world,))


def _batches(steps: int = 4, batch: int = 8) -> list:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, 6, generator=g), torch.randn(batch, 4, generator=g)) for _ in range(steps)]


_BATCHES = _batches()


def _model_and_optimizer(seed: int, device: str):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 10), nn.Tanh(), nn.Linear(10, 4)).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)


def _fsdp_model_and_optimizer(seed: int):
    """The model under FSDP2 (each Linear, then the root), its AdamW over the sharded parameters."""
    from torch.distributed.fsdp import fully_shard

    model, _ = _model_and_optimizer(seed, device="tpu")
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)


def _assert_holds(t: torch.Tensor, expected: torch.Tensor, **tolerance) -> None:
    """``t`` is on tpu and holds ``expected``; a DTensor holds its chunk of it
    on this rank (compared locally: its local tensor on tpu, no collective)."""
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        (placement,) = t.placements
        mesh = t.device_mesh
        expected = _local_chunk(expected, placement, mesh.get_local_rank(), mesh.size())
        t = t.to_local()
    assert t.device == torch.device("tpu", 0), t.device
    assert_close(t.detach().cpu(), expected, **tolerance)


def _train(model, opt, batches, rank: int, world: int) -> None:
    """Steps on ``batches``, each rank on its slice of every batch (the mean
    loss of a slice; DDP averages the gradients, giving the whole batch's)."""
    device = next(model.parameters()).device
    for x, y in batches:
        n = x.shape[0] // world
        x, y = x[rank * n : (rank + 1) * n].to(device), y[rank * n : (rank + 1) * n].to(device)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def _assert_trained_as_cpu(model, opt, steps: int) -> None:
    """``model`` and ``opt`` hold what ``steps`` steps of single-process CPU
    training on the whole batch give (parameters and AdamW's state, on tpu)."""
    ref, ref_opt = _model_and_optimizer(seed=0, device="cpu")
    _train(ref, ref_opt, _BATCHES[:steps], rank=0, world=1)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        _assert_holds(p, q.detach(), rtol=1e-4, atol=1e-5)
        state, ref_state = opt.state[p], ref_opt.state[q]
        assert_close(state["step"], ref_state["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            _assert_holds(state[key], ref_state[key], rtol=1e-4, atol=1e-6, msg=key)


# -- workers (the rank side) -------------------------------------------------------------------


def _section_tensors(rank, world):
    """Save with 2 ranks, load with 2: values, dtypes, devices and placements
    as saved; one host read per tensor this rank writes, nothing read back at
    the load (the chunks are uploaded and recorded), no CPU fallback."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import distribute_tensor

    import lazytpu

    mesh, values, path = _mesh(world), _saved_values(), os.path.join(ROOT, "tensors")
    base = values["f32"].to("tpu")
    state = {"f32": base, "column": base[:, 1], "transposed": base.t(), "pending": base * 2 + 1}
    for key in ("bf16", "i64", "flag", "scalar"):
        state[key] = values[key].to("tpu")
    for key, placement in _PLACEMENTS.items():
        state[key] = distribute_tensor(values[key].to("tpu"), mesh, [_placement(placement)])
    state.update(step=values["step"], name=values["name"])
    lazytpu.metrics.reset()
    with _host_reads() as reads:
        dcp.save(state, checkpoint_id=path)
    _assert_one_read_per_item(path, rank, reads)
    snap = lazytpu.metrics.snapshot()
    assert not snap["cpu_fallbacks"] and snap["programs_executed"] <= 1, snap

    out = {k: torch.zeros_like(v, device="tpu") for k, v in values.items() if isinstance(v, torch.Tensor)}
    for key, placement in _PLACEMENTS.items():
        out[key] = distribute_tensor(torch.zeros_like(values[key], device="tpu"), mesh, [_placement(placement)])
    out.update(step=0, name="")
    torch.tpu.synchronize()  # the destinations' broadcasts (Replicate), before the load's own host collectives
    lazytpu.metrics.reset()
    with _host_reads() as reads:
        dcp.load(out, checkpoint_id=path)
    snap = lazytpu.metrics.snapshot()
    assert reads == [0] and not snap["cpu_fallbacks"] and snap["programs_executed"] == 0, (reads, snap)
    _check_loaded(out, values, {k: [_placement(p)] for k, p in _PLACEMENTS.items()})


def _assert_one_read_per_item(path: str, rank: int, reads: list) -> None:
    """This rank's save read each tensor it wrote (DCP's metadata says which) once from the device."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(path).read_metadata()
    written = [i for i, info in metadata.storage_data.items() if info.relative_path.startswith(f"__{rank}_")]
    on_tpu = [i for i in written if isinstance(metadata.state_dict_metadata[i.fqn], dcp.metadata.TensorStorageMetadata)]
    on_tpu = [i for i in on_tpu if not i.fqn.endswith(".step")]  # AdamW's step counts are CPU tensors
    assert on_tpu and reads == [len(on_tpu)], (reads, written)


def _check_loaded(out: dict, values: dict, placements: dict) -> None:
    from torch.distributed.tensor import DTensor

    for key, value in values.items():
        got = out[key]
        if not isinstance(value, torch.Tensor):
            assert got == value, (key, got)
            continue
        if key in placements:
            assert isinstance(got, DTensor) and tuple(got.placements) == tuple(placements[key]), (key, got)
        _assert_holds(got, value, msg=key)


def _local_chunk(value: torch.Tensor, placement, rank: int, world: int) -> torch.Tensor:
    if placement.is_replicate():
        return value
    chunks = torch.chunk(value, world, dim=placement.dim)  # DTensor's uneven shards: the last ones may be empty
    return chunks[rank] if rank < len(chunks) else value.narrow(placement.dim, 0, 0)


def _section_ddp(rank, world):
    """DDP + AdamW: 2 steps, get_state_dict, dcp.save; a fresh DDP model and
    optimizer (other initial values) load it with set_state_dict and train 2
    more steps: as 4 steps of CPU training, and as the uninterrupted run."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, opt = _model_and_optimizer(seed=0, device="tpu")
    model = DDP(model)
    _train(model, opt, _BATCHES[:2], rank, world)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(ROOT, "ddp"))
    _train(model, opt, _BATCHES[2:], rank, world)

    fresh, fresh_opt = _model_and_optimizer(seed=1, device="tpu")
    fresh = DDP(fresh)
    _resume(fresh, fresh_opt, os.path.join(ROOT, "ddp"))
    _assert_trained_as_cpu(fresh.module, fresh_opt, steps=2)
    _train(fresh, fresh_opt, _BATCHES[2:], rank, world)
    _assert_trained_as_cpu(fresh.module, fresh_opt, steps=4)
    for p, q in zip(fresh.parameters(), model.parameters(), strict=True):
        assert_close(p.detach().cpu(), q.detach().cpu())


def _resume(model, opt, path: str) -> None:
    """get_state_dict, dcp.load, set_state_dict: what a training script does."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _section_async_save(rank, world):
    """dcp.async_save stages tpu tensors and DTensors (DDP's and FSDP2's state)
    to the host at the call (one read per storage): writing the parameters
    after it does not change what is saved. (No training step overlaps the
    writer thread here: see docs/checkpoints_and_data.md.)"""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.nn.parallel import DistributedDataParallel as DDP

    def ddp(seed):
        model, opt = _model_and_optimizer(seed, device="tpu")
        return DDP(model), opt

    for name, make in (("ddp", ddp), ("fsdp", _fsdp_model_and_optimizer)):
        model, opt = make(seed=0)
        _train(model, opt, _BATCHES[:2], rank, world)
        msd, osd = get_state_dict(model, opt)
        path = os.path.join(ROOT, f"async_{name}")
        with _host_reads() as reads:
            future = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=path)
            staged = reads[0]
        with torch.no_grad():  # written while the files are: the checkpoint keeps the staged values
            for p in model.parameters():
                p.add_(1.0)
        future.result()
        assert staged == 3 * len(msd), (name, staged)  # each parameter, exp_avg, exp_avg_sq (step: CPU)
        fresh, fresh_opt = make(seed=1)
        _resume(fresh, fresh_opt, path)
        _assert_trained_as_cpu(getattr(fresh, "module", fresh), fresh_opt, steps=2)


def _section_reshard_tensors(rank, world):
    """The 2-rank checkpoint loaded by 4 ranks, some DTensors in other
    placements than they were saved in: DCP reshards them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import distribute_tensor

    mesh, values = _mesh(world), _saved_values()
    placements = {"shard0": "Replicate()", "shard1": "Shard(1)", "repl": "Shard(0)", "f32": "Shard(0)"}
    out = {k: torch.zeros_like(v, device="tpu") for k, v in values.items() if isinstance(v, torch.Tensor)}
    for key, placement in placements.items():
        out[key] = distribute_tensor(torch.zeros_like(values[key], device="tpu"), mesh, [_placement(placement)])
    out.update(step=0, name="")
    with _host_reads() as reads:
        dcp.load(out, checkpoint_id=os.path.join(ROOT, "tensors"))
    assert reads == [0], reads
    _check_loaded(out, values, {k: [_placement(p)] for k, p in placements.items()})


def _section_fsdp(rank, world):
    """FSDP2 + AdamW: 2 steps, get_state_dict (DTensors, Shard(0)), dcp.save
    (one host read per shard written); a fresh FSDP2 model and optimizer load
    it and train 2 more steps: as CPU training and the uninterrupted run. A
    full state dict (gathered on tpu), and set from rank 0 by broadcast, too."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
    )

    model, opt = _fsdp_model_and_optimizer(seed=0)
    _train(model, opt, _BATCHES[:2], rank, world)
    msd, osd = get_state_dict(model, opt)
    path = os.path.join(ROOT, "fsdp")
    with _host_reads() as reads:
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    _assert_one_read_per_item(path, rank, reads)

    # Every rank gathers the full tensors and reads them.
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    ref, _ = _model_and_optimizer(seed=0, device="cpu")
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.05, weight_decay=0.1)
    _train(ref, ref_opt, _BATCHES[:2], rank=0, world=1)
    assert set(full) == set(ref.state_dict()), sorted(full)
    for key, value in full.items():
        _assert_holds(value, ref.state_dict()[key], rtol=1e-4, atol=1e-5, msg=key)
    # With cpu_offload only rank 0 keeps them (on the CPU); the other ranks drop the all-gathers'
    # results, which must run all the same (Note [Runner effects] in lazytpu/engine.py): it hung.
    offloaded = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        assert set(offloaded) == set(ref.state_dict()), sorted(offloaded)
        for key, value in offloaded.items():
            assert value.device.type == "cpu", key
            assert_close(value, ref.state_dict()[key], rtol=1e-4, atol=1e-5, msg=key)
    else:
        assert offloaded == {}, sorted(offloaded)
    broadcast, _ = _fsdp_model_and_optimizer(seed=1)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(broadcast, full, options=options)
    for p, q in zip(broadcast.parameters(), ref.parameters(), strict=True):
        _assert_holds(p, q.detach(), rtol=1e-4, atol=1e-5)

    _train(model, opt, _BATCHES[2:], rank, world)
    fresh, fresh_opt = _fsdp_model_and_optimizer(seed=1)
    _resume(fresh, fresh_opt, path)
    _assert_trained_as_cpu(fresh, fresh_opt, steps=2)
    _train(fresh, fresh_opt, _BATCHES[2:], rank, world)
    _assert_trained_as_cpu(fresh, fresh_opt, steps=4)
    for p, q in zip(fresh.parameters(), model.parameters(), strict=True):
        assert tuple(p.placements) == tuple(q.placements)
        assert_close(p.to_local().cpu(), q.to_local().cpu())


def _section_reshard_fsdp(rank, world):
    """The FSDP2 checkpoint of 2 ranks resumed by 4 (shards of other sizes,
    uneven ones among them): as CPU training."""
    model, opt = _fsdp_model_and_optimizer(seed=1)
    _resume(model, opt, os.path.join(ROOT, "fsdp"))
    _assert_trained_as_cpu(model, opt, steps=2)
    _train(model, opt, _BATCHES[2:], rank, world)
    _assert_trained_as_cpu(model, opt, steps=4)


# Each job compiles its ranks' programs on a shared, loaded machine: watchdogs wider than the harness's.
ENV = {_DIR_VAR: ROOT, "TORCHTPU_EAGER_MODE": "defer", "DIST_TEST_WATCHDOG_S": "240"}
JOBS = {
    "two": Job(ENV, [_section_tensors, _section_ddp, _section_async_save, _section_fsdp], world=2, timeout=300),
    "four": Job(ENV, [_section_reshard_tensors, _section_reshard_fsdp], world=4, timeout=300),
}
HARNESS = Harness(__file__, JOBS)

if __name__ == "__main__":
    HARNESS.main()
