"""FSDP2 (``torch.distributed.fsdp.fully_shard``) on ``tpu``: real processes on 127.0.0.1.

The distributed tests launch ranks of this file (``python test_fsdp.py JOB``,
tests/dist_harness.py); each rank trains a model sharded per layer and at the
root, each on its own slice of the batch, and checks the result against
single-process training of the whole batch on CPU. The tests before them run
in this process: what FSDP2 needs of the device (Note [Storage resize] in
lazytpu/frontend/storages.py, Python kernels of library ops, Note [Resolution
order] in lazytpu/frontend/dispatch.py).
"""

from __future__ import annotations

import copy
import gc

import pytest
import torch
from dist_harness import Harness, Job, report, tiny_llama

import lazytpu

# -- in this process ---------------------------------------------------------------------


def test_storage_resize_frees_and_reallocates_what_its_tensors_share():
    host = torch.arange(6.0)
    t = host.to("tpu")
    view = t[2:]
    storage = t.untyped_storage()
    assert storage.size() == 24 and view.untyped_storage().size() == 24
    torch.tpu.synchronize()
    before = torch.tpu.memory_allocated()
    storage.resize_(0)
    assert t.untyped_storage().size() == 0 and view.untyped_storage().size() == 0
    assert torch.tpu.memory_allocated() == before - 24  # the buffer is let go
    with pytest.raises(RuntimeError, match="freed"):
        view.cpu()
    storage.resize_(24)
    assert t.untyped_storage().size() == 24
    with torch.no_grad():
        t.copy_(host * 10)
    torch.testing.assert_close(view.cpu(), host[2:] * 10)
    torch.testing.assert_close(t.cpu(), host * 10)


def test_storage_resize_keeps_what_was_computed_before():
    t = torch.ones(4).to("tpu")
    y = t * 3  # pending: reads t's value before the free
    t.untyped_storage().resize_(0)
    torch.testing.assert_close(y.cpu(), torch.full((4,), 3.0))


def test_storage_resize_to_another_size_is_not_supported():
    t = torch.ones(4).to("tpu")
    with pytest.raises(NotImplementedError, match="resize_"):
        t.untyped_storage().resize_(8)


_LIB = torch.library.Library("lazytpu_test_fsdp", "DEF")
_LIB.define("scaled_copy(Tensor x, float alpha, *, Tensor(a!) out) -> ()")


@torch.library.impl(_LIB, "scaled_copy", "PrivateUse1")
def _scaled_copy(x, alpha, *, out):
    out.copy_(x * alpha)


def test_a_library_op_with_a_python_device_kernel_is_recorded():
    """FSDP2's ``fsdp.*`` ops have Python kernels for PrivateUse1: they run on
    tpu tensors, fused with the rest, never on the CPU fallback."""
    x = torch.randn(3, 4)
    out = torch.empty(3, 4, device="tpu")
    torch.tpu.synchronize()
    before = lazytpu.metrics.snapshot()
    torch.ops.lazytpu_test_fsdp.scaled_copy(x.to("tpu") + 1, 2.0, out=out)
    result = (out * 2).cpu()
    after = lazytpu.metrics.snapshot()
    torch.testing.assert_close(result, (x + 1) * 4)
    assert after["cpu_fallbacks"] == before["cpu_fallbacks"]
    assert after["programs_executed"] == before["programs_executed"] + 1


# -- the distributed tests ---------------------------------------------------------------
# One launch per world size (starting ranks costs ~15 s on 2 cores).


@pytest.mark.parametrize("job", ["two", "four"])
def test_mlp_per_layer_and_root_matches_single_process_training(job):
    """Also: no recompiles after warm-up, the programs of an unsharded step,
    and 1/world of the unsharded model's parameter and optimizer bytes."""
    assert_section(job, "mlp")


def test_mlp_without_resharding_after_forward():
    assert_section("two", "mlp_no_reshard")


@pytest.mark.parametrize("job", ["two", "four"])
def test_mixed_precision_bf16_parameters_fp32_reduction(job):
    assert_section(job, "mixed_precision")


def test_llama_per_layer_and_root_matches_single_process_training():
    assert_section("two", "llama")


@pytest.mark.parametrize("job", ["two", "four"])
def test_jobs_exit_cleanly(job):
    results = run_job(job)
    assert all(code == 0 for code, _ in results), report(results)


# -- the ranks' sections -----------------------------------------------------------------


def _mlp(sizes=(8, 32, 32, 4)):
    torch.manual_seed(0)
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def _llama():
    return tiny_llama()


def _shard(model, blocks, mesh, **options):
    """``fully_shard`` on each of ``blocks`` and at the root."""
    from torch.distributed.fsdp import fully_shard

    for block in blocks:
        fully_shard(block, mesh=mesh, **options)
    return fully_shard(model, mesh=mesh, **options)


def _mesh(world):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("tpu", (world,))


def _mse(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def _causal_lm(model, ids, _):
    return model(input_ids=ids, labels=ids).loss


def _mlp_batches(world, steps, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(world * 4, 8, generator=g), torch.randn(world * 4, 4, generator=g)) for _ in range(steps)]


def _train(model, batches, loss_fn, lr, rank=0, world=1, device="cpu"):
    """AdamW steps of ``model`` on this rank's slice of each batch; returns
    the optimizer and, per step, (loss, programs compiled, programs executed),
    counted from the step's start to the next's."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    log = []
    for x, y in batches:
        before = lazytpu.metrics.snapshot()  # the previous step's update may run at the next step's first op
        x, y = x.chunk(world)[rank].to(device), y.chunk(world)[rank].to(device)
        loss = loss_fn(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        after = lazytpu.metrics.snapshot()
        compiled = after["programs_compiled"] - before["programs_compiled"]
        log.append((loss.item(), compiled, after["programs_executed"] - before["programs_executed"]))
    return opt, log


def _full_parameters(model) -> list:
    return [p.full_tensor().cpu() if hasattr(p, "full_tensor") else p.detach().cpu() for p in model.parameters()]


def _held() -> int:
    """The bytes of the device buffers live now (torch.tpu's memory API)."""
    gc.collect()
    torch.tpu.synchronize()
    return torch.tpu.memory_allocated()


def _state_bytes(model) -> int:
    """What AdamW training leaves on this rank: parameters (their local
    shards), exp_avg and exp_avg_sq, all fp32 (the step counts are on the
    host), and the buffers."""
    local = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())
    return 3 * 4 * local + sum(b.numel() * b.element_size() for b in model.buffers())


def _check_against_cpu(rank, world, make, blocks_of, batches, loss_fn, lr, one_device=True, **options):
    """FSDP2 training on tpu equals single-process CPU training of the whole
    batches; after two warm-up steps nothing compiles; each rank holds its
    1/world of the parameters and optimizer state. With ``one_device``, also
    against the unsharded model trained on one device: a step runs as many
    programs, and the rank holds 1/world of its memory."""
    reference = make()
    start = _held()
    model = copy.deepcopy(reference).to("tpu")
    _shard(model, blocks_of(model), _mesh(world), **options)
    opt, log = _train(model, batches, loss_fn, lr, rank, world, "tpu")
    sharded = _held() - start
    _, ref_log = _train(reference, batches, loss_fn, lr)
    for got, want in zip(_full_parameters(model), reference.parameters()):
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-5)
    assert [c for _, c, _ in log[2:]] == [0] * (len(log) - 2), log
    assert sharded == _state_bytes(model), (sharded, _state_bytes(model))
    buffers = sum(b.numel() * b.element_size() for b in reference.buffers())
    assert (sharded - buffers) * world == _state_bytes(reference) - buffers, (sharded, _state_bytes(reference))
    steady = {e for _, _, e in log[2:]}
    assert len(steady) == 1 and steady <= {1, 2, 3}, log  # at most forward, backward, update (Note [Step segments])
    del model, opt
    plain = None
    if one_device:
        start = _held()
        model = copy.deepcopy(reference).to("tpu")
        opt, plain = _train(model, batches, loss_fn, lr, device="tpu")
        full = _held() - start
        assert [e for _, _, e in log[2:]] == [e for _, _, e in plain[2:]], (log, plain)
        assert full == _state_bytes(model) and (sharded - buffers) * world == full - buffers, (sharded, full)
    if rank == 0:
        on_one = plain and [x[1:] for x in plain]
        print(f"programs (compiled, executed) per step: fsdp {[x[1:] for x in log]}, one device {on_one}")
        print(f"bytes held by rank 0 of {world}: {sharded} (cpu losses {[round(x[0], 4) for x in ref_log]})")


def _section_mlp(rank, world):
    _check_against_cpu(rank, world, _mlp, lambda m: m[::2], _mlp_batches(world, 4), _mse, 1e-2)


def _section_mlp_no_reshard(rank, world):
    _check_against_cpu(
        rank, world, _mlp, lambda m: m[::2], _mlp_batches(world, 4), _mse, 1e-2, reshard_after_forward=False
    )


def _section_llama(rank, world):
    g = torch.Generator().manual_seed(1)
    batches = [(ids, ids) for ids in (torch.randint(0, 256, (world * 2, 16), generator=g) for _ in range(3))]
    _check_against_cpu(rank, world, _llama, lambda m: m.model.layers, batches, _causal_lm, 1e-3, one_device=False)


def _section_mixed_precision(rank, world):
    """bf16 parameters in forward and backward, gradients reduced and kept in
    fp32: against CPU torch doing the same math (each rank's bf16 gradients
    cast to fp32 and averaged, fp32 AdamW), at bf16's tolerance."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    batches = _mlp_batches(world, 5, seed=2)
    reference = _mlp()
    model = copy.deepcopy(reference).to("tpu")
    _shard(model, model[::2], _mesh(world), mp_policy=policy)
    seen = []
    model[0].register_forward_pre_hook(lambda m, args: seen.append((m.weight.dtype, args[0].dtype)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    programs = []
    for x, y in batches:
        before = lazytpu.metrics.snapshot()
        loss = _mse(model, x.chunk(world)[rank].to("tpu"), y.chunk(world)[rank].to("tpu"))
        loss.backward()
        assert {p.grad.dtype for p in model.parameters()} == {torch.float32}
        opt.step()
        opt.zero_grad()
        after = lazytpu.metrics.snapshot()
        programs.append(tuple(after[k] - before[k] for k in ("programs_compiled", "programs_executed")))
        grads = [torch.zeros_like(p) for p in reference.parameters()]
        for xs, ys in zip(x.chunk(world), y.chunk(world)):
            low = copy.deepcopy(reference).to(torch.bfloat16)
            _mse(low, xs.to(torch.bfloat16), ys).backward()
            for g, p in zip(grads, low.parameters()):
                g += p.grad.float() / world
        for p, g in zip(reference.parameters(), grads):
            p.grad = g
        ref_opt.step()
        ref_opt.zero_grad()
    assert seen[0] == (torch.bfloat16, torch.bfloat16), seen
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    for got, want in zip(_full_parameters(model), reference.parameters()):
        torch.testing.assert_close(got, want.detach(), rtol=2e-3, atol=2e-3)
    # AdamW's Python numbers are lifted to inputs once they change (Note [Scalar lifting]):
    # the optimizer's own program compiles until its fourth step
    assert programs[4][0] == 0 and programs[4][1] <= 3, programs  # Note [Step segments]


# Compiling the sharded programs is most of the time; a loaded 2-core machine
# needs more than the harness's default deadlines.
_ENV = {"TORCHTPU_EAGER_MODE": "defer", "DIST_TEST_WATCHDOG_S": "300"}
JOBS = {
    "two": Job(_ENV, [_section_mlp, _section_mlp_no_reshard, _section_mixed_precision, _section_llama], timeout=420),
    "four": Job(_ENV, [_section_mlp, _section_mixed_precision], world=4, timeout=420),
}
HARNESS = Harness(__file__, JOBS)
run_job, assert_section = HARNESS.run_job, HARNESS.assert_section


if __name__ == "__main__":
    HARNESS.main()
