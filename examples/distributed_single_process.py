"""Data-parallel training over the devices of one process (``LocalMesh``).

One process drives every local device: several chips of a TPU host, or on
CPU as many XLA:CPU devices as asked for::

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/distributed_single_process.py

Each device holds a replica of the model and trains on its slice of every
batch; after each backward the gradients are averaged over the mesh (one XLA
all-reduce program over all devices), so the replicas stay identical. At the
end the replicas are checked against the same model trained on the whole
batches on CPU.
"""

from __future__ import annotations

import copy
import time

import torch
import torch.nn.functional as F

import lazytpu  # noqa: F401  (registers the "tpu" device)
from lazytpu.distributed import LocalMesh

STEPS, BATCH_PER_DEVICE = 10, 8


def main() -> None:
    mesh = LocalMesh(dim_name="dp")  # like init_device_mesh("tpu", (N,), mesh_dim_names=("dp",))
    n = mesh.size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    reference = copy.deepcopy(model)
    replicas = [copy.deepcopy(model).to(device) for device in mesh.devices]
    opts = [torch.optim.SGD(r.parameters(), lr=0.1, momentum=0.9) for r in replicas]
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)

    gen = torch.Generator().manual_seed(1)
    start = time.perf_counter()
    for step in range(STEPS):
        x, y = torch.randn(n * BATCH_PER_DEVICE, 16, generator=gen), torch.randn(n * BATCH_PER_DEVICE, 4, generator=gen)
        losses = []
        for replica, opt, xs, ys in zip(replicas, opts, mesh.scatter(x), mesh.scatter(y)):
            opt.zero_grad()
            loss = F.mse_loss(replica(xs), ys)
            loss.backward()  # recorded on this replica's device
            losses.append(loss.detach())
        for grads in zip(*([p.grad for p in r.parameters()] for r in replicas)):
            mesh.all_reduce_(list(grads), op="avg")  # one program over the mesh
        for opt in opts:
            opt.step()
        mesh.all_reduce_(losses, op="avg")
        if step % 5 == 0:
            print(f"step {step:2d}  loss {losses[0].item():.4f}", flush=True)
        ref_opt.zero_grad()
        F.mse_loss(reference(x), y).backward()
        ref_opt.step()
    elapsed = time.perf_counter() - start

    matches = all(
        torch.allclose(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5)
        for replica in replicas
        for p, q in zip(replica.parameters(), reference.parameters())
    )
    print(f"{n} devices ({mesh}), {STEPS} steps in {elapsed:.1f} s")
    print(f"every replica matches single-device training on the whole batch: {matches}")
    if not matches:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
