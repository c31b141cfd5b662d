"""The ``tpu`` device in torch: everything that plugs lazytpu into torch's own
tables and entry points.

- ``registration``: renames PrivateUse1 to ``tpu`` and installs the factories,
  the backend fallback, autocast, SDPA, the optimizer-step hook, checkpoint
  tagging and the ``Module._apply`` patch (``lazytpu/__init__.py`` calls
  ``registration.register()`` once, at import).
- ``tpu``: the ``torch.tpu`` module (TorchTPU's names).
- ``memory``: ``torch.tpu``'s memory functions (Note [Device memory] in lazytpu.runtime.memory).
- ``streams``: ``torch.tpu``'s streams and events (Note [One queue]).
- ``accelerator``: ``torch.accelerator``'s streams, synchronize and memory functions reach
  ``torch.tpu``'s (Note [Accelerator routing]); ``registration`` installs it.
- ``checkpoint``: the ordering barrier on ``torch.utils.checkpoint``'s recomputation and its
  random state (Note [Recomputation barrier], Note [Recomputed random ops]);
  ``registration`` installs it.
- ``autocast``: ``torch.autocast("tpu")`` kernels (Note [Autocast on PrivateUse1]).
- ``sdpa``: ``F.scaled_dot_product_attention`` as one fused op (Note [SDPA on PrivateUse1]).
- ``module_conversion``: ``Module.to("tpu")`` keeps Parameters (Note [Module conversion]),
  and lazy modules' uninitialized ones (Note [Lazy modules on tpu]).
- ``serialization``: ``torch.load``'s ``map_location`` onto tpu, tpu storages (Note [tpu
  storages] in frontend/hostio), ``pin_memory()`` (Note [Pinned memory]) and tpu tensors
  between processes (Note [tpu tensors between processes]); ``registration`` installs it.

Imports: this package sits above the recording stage. It may import torch, the
leaf modules (``_config``, ``_caches``, ``metrics``, ``_dtypes``), ``engine``,
``runtime``, ``lowering`` and the op frontend (``tensor``, ``dispatch``,
``handlers``, ``views``, ``hostio``, ``bounds``); nothing below it imports it,
except ``lazytpu/__init__.py``. This file imports nothing, so importing one
module of the package does not register the device (docs/architecture.md).
"""
