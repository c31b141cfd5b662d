"""lazytpu: PyTorch on XLA devices, deferred and fused.

After ``import lazytpu`` the device ``"tpu"`` exists in torch::

    import torch, lazytpu
    x = torch.randn(2, 2, device="tpu")
    print(x @ x)

Ops are recorded and fused at sync points into one XLA program (defer mode),
or run one by one (strict mode); see ``torch.tpu.set_eager_mode``.
"""

from __future__ import annotations

import gc

from lazytpu import _config, compile, debug, distributed, generation, metrics, runtime  # noqa: F401
from lazytpu.device import registration
from lazytpu.engine import EagerMode, sync_all

# compile and distributed are imported for their registrations: the torch.compile
# backend "tpu" and the torch.distributed backend "tpu_dist".
from lazytpu.frontend.checks import bounds  # noqa: F401
from lazytpu.frontend.tensor import LazyTensor

__all__ = ["EagerMode", "LazyTensor", "debug", "generation", "metrics", "runtime", "sync"]
__version__ = "0.1.0"


def sync() -> None:
    """Run every pending op on every device now (one program per device)."""
    sync_all("lazytpu.sync")


runtime.platform.check_requested_platform()  # Note [Platform at import]
registration.register()
if bounds.enabled():
    bounds.install()

# Note [Frozen imports]: a defer step makes thousands of short-lived objects
# (wrappers, nodes, tuples of plans), many of them still alive at a young
# collection, so Python's garbage collector runs a full collection every 100
# or so steps of a small model, and a full collection scans every object of
# the process: about 240k once torch and JAX are imported, 470k with
# transformers and a model; 250 ms each on the small Llama step. The objects
# that exist when lazytpu is imported are the libraries' module state, which
# lives as long as the process: ``gc.freeze()`` moves them to the collector's
# permanent generation, which no collection scans (reference counting still
# frees them). Full collections then take half as long (120 ms), and the
# llama step's time in the collector falls from 2.0-2.3 to 0.7 ms a step on
# average over 300 steps (``benchmarks.steps.GcTime``). Objects made after
# the import are collected as always. ``LAZYTPU_GC_FREEZE=0`` turns it off.
if _config.GC_FREEZE.get():
    gc.freeze()
