"""Data-parallel training on ``tpu`` with ``torch.distributed`` (backend ``tpu_dist``).

Launch one process per device with torchrun::

    torchrun --nproc-per-node 2 examples/distributed_train.py

(on CPU this runs two XLA:CPU processes over 127.0.0.1; on a TPU host, one
process per chip, or per host with several chips). Each rank trains the same
model on its own slice of every batch; ``DistributedDataParallel`` averages
the gradients with XLA all-reduces, so every rank ends with the same weights.
Rank 0 prints the loss and, at the end, checks that all ranks agree.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import lazytpu  # noqa: F401  (registers the "tpu" device and the "tpu_dist" backend)

STEPS, BATCH_PER_RANK = 20, 32


def main() -> None:
    # Before the first tpu tensor: starts JAX's multi-process runtime.
    dist.init_process_group(backend="tpu_dist")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("tpu", 0)  # this process's first device (one process per chip: its chip)

    torch.manual_seed(0)  # the same model everywhere (DDP broadcasts rank 0's anyway)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 10)).to(device)
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)

    gen = torch.Generator().manual_seed(1234 + rank)  # each rank its own data
    target = torch.randn(64, 10, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    for step in range(STEPS):
        x = torch.randn(BATCH_PER_RANK, 64, generator=gen)
        y = (x @ target).argmax(-1)
        opt.zero_grad()
        loss = F.cross_entropy(ddp(x.to(device)), y.to(device))
        loss.backward()
        opt.step()  # a sync point: one program per step
        if rank == 0 and step % 5 == 0:
            print(f"step {step:3d}  loss {loss.item():.4f}", flush=True)
    elapsed = time.perf_counter() - start

    # Every rank holds the same parameters: compare their max and min over ranks.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    same = torch.equal(high.cpu(), low.cpu())
    if rank == 0:
        print(f"{world} ranks, {STEPS} steps in {elapsed:.1f} s; parameters identical on all ranks: {same}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
