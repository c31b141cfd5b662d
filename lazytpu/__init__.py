"""lazytpu: PyTorch on XLA devices, deferred and fused.

After ``import lazytpu`` the device ``"tpu"`` exists in torch::

    import torch, lazytpu
    x = torch.randn(2, 2, device="tpu")
    print(x @ x)

Ops are recorded and fused at sync points into one XLA program (defer mode),
or run one by one (strict mode); see ``torch.tpu.set_eager_mode``.
"""

from __future__ import annotations

from lazytpu import compile, debug, distributed, metrics, runtime  # noqa: F401
from lazytpu.device import registration
from lazytpu.engine import EagerMode, sync_all

# compile and distributed are imported for their registrations: the torch.compile
# backend "tpu" and the torch.distributed backend "tpu_dist".
from lazytpu.frontend.checks import bounds  # noqa: F401
from lazytpu.frontend.tensor import LazyTensor

__all__ = ["EagerMode", "LazyTensor", "debug", "metrics", "runtime", "sync"]
__version__ = "0.1.0"


def sync() -> None:
    """Run every pending op on every device now (one program per device)."""
    sync_all("lazytpu.sync")


runtime.platform.check_requested_platform()  # Note [Platform at import]
registration.register()
if bounds.enabled():
    bounds.install()
