"""Sharded data-parallel training on ``tpu`` with FSDP2 (``torch.distributed.fsdp.fully_shard``).

Launch one process per device with torchrun::

    torchrun --nproc-per-node 2 examples/fsdp_train.py

(on CPU this runs two XLA:CPU processes over 127.0.0.1; on a TPU host, one
process per chip). ``fully_shard`` splits every parameter, its gradient and
its AdamW state into one shard per rank: before each block's forward and
backward its parameters are all-gathered, after the backward its gradients
are reduce-scattered, all as XLA collectives inside the step's programs. Each
rank trains on its own slice of every batch. At the end rank 0 checks the
sharded model against the same training on CPU torch over the whole batch,
and every rank prints how much of the model's parameters and optimizer state
it holds (``torch.tpu.memory_allocated()``).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import lazytpu  # noqa: F401  (registers the "tpu" device and the "tpu_dist" backend)

STEPS, BATCH, WIDTH, BLOCKS = 10, 32, 256, 4


def make_model() -> torch.nn.Sequential:
    torch.manual_seed(0)  # the same initial weights on every rank and for the CPU reference
    blocks = [torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU()) for _ in range(BLOCKS)]
    return torch.nn.Sequential(*blocks, torch.nn.Linear(WIDTH, 10))


def batches():
    gen = torch.Generator().manual_seed(1234)  # the whole batch, the same on every rank
    for _ in range(STEPS):
        x = torch.randn(BATCH, WIDTH, generator=gen)
        yield x, (x[:, :10] * 3).argmax(-1)


def train(model, opt, device, part=slice(None)) -> list[float]:
    losses = []
    for x, y in batches():
        loss = F.cross_entropy(model(x[part].to(device)), y[part].to(device))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return [float(loss) for loss in losses]  # read once, at the end: no host read inside the loop


def main() -> None:
    dist.init_process_group(backend="tpu_dist")  # before the first tpu tensor of the process
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("tpu", (world,))

    model = make_model().to("tpu")
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for block in model[:-1]:
        fully_shard(block, mesh=mesh)  # each block all-gathers its parameters only while it runs
    fully_shard(model, mesh=mesh)  # the root: the last Linear, and the step's bookkeeping

    per_rank = BATCH // world
    start = time.perf_counter()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = train(model, opt, "tpu", slice(rank * per_rank, (rank + 1) * per_rank))
    elapsed = time.perf_counter() - start
    torch.tpu.synchronize()
    held = torch.tpu.memory_allocated()  # parameter shards, AdamW state shards, nothing gathered
    print(
        f"[rank {rank}] holds {held / (3 * full_bytes):.2f} of the parameters + AdamW state "
        f"({held} of {3 * full_bytes} bytes unsharded)",
        flush=True,
    )

    # The gradients were averaged over ranks, so the sharded run trains as one process on the whole batch.
    full = [p.full_tensor().cpu() for p in model.parameters()]  # collectives: every rank takes part
    if rank == 0:
        reference = make_model()
        cpu_losses = train(reference, torch.optim.AdamW(reference.parameters(), lr=1e-3), "cpu")
        same = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(full, reference.parameters()))
        print(
            f"{world} ranks, {STEPS} steps in {elapsed:.1f} s; "
            f"rank 0's loss on its slice {losses[0]:.4f} -> {losses[-1]:.4f}"
        )
        print(f"CPU torch, loss on the whole batch: {cpu_losses[0]:.4f} -> {cpu_losses[-1]:.4f}")
        print(f"parameters equal to CPU training on the whole batch: {same}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
