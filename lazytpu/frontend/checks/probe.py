"""Running a call on CPU torch stand-ins, to raise CPU torch's own errors.

Note [CPU probes]: some of torch's checks live only in its CPU kernels (meta
kernels skip them or word them differently). A probe runs the call on CPU
zeros with the arguments' layouts (tensors sharing a storage share one here
too) and hands back what it raised; the caller decides which errors to
re-raise. The probe runs once per call signature: callers memoize it.
"""

from __future__ import annotations

import torch

from lazytpu.frontend.tensor import LazyTensor


def tensor_leaves(x) -> list:
    if type(x) is LazyTensor:
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in tensor_leaves(y)]
    if isinstance(x, dict):
        return tensor_leaves(list(x.values()))
    return []


def cpu_probe(func, args, kwargs) -> Exception | None:
    """What ``func`` raises on CPU torch with zeros in tensors of the arguments' layouts
    (tensors sharing a storage share one here too); None when it raises nothing."""
    leaves = tensor_leaves((args, kwargs))
    groups = [next(i for i, u in enumerate(leaves) if u._lt_storage is t._lt_storage) for t in leaves]
    sizes: dict = {}
    for t, g in zip(leaves, groups):
        sizes[g] = max(sizes.get(g, 0), t._lt_desc.storage_numel * t.dtype.itemsize)
    buffers = {g: torch.zeros(-(-n // 16) * 16, dtype=torch.uint8) for g, n in sizes.items()}
    proxies = {
        id(t): buffers[g].view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())
        for t, g in zip(leaves, groups)
    }

    def cpu(x):
        if type(x) is LazyTensor:
            return proxies[id(x)]
        if isinstance(x, (list, tuple)):
            return type(x)(cpu(y) for y in x)
        if isinstance(x, torch.device) or (isinstance(x, str) and x.startswith("tpu")):
            return torch.device("cpu")
        return x

    try:
        with torch.no_grad():
            func(*cpu(tuple(args)), **{k: cpu(v) for k, v in kwargs.items()})
    except Exception as exc:  # noqa: BLE001 - the caller picks the errors it re-raises
        return exc
    return None
