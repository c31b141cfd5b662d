"""``DistributedDataParallel`` options that cannot run on ``tpu`` fail at construction.

Note [DDP and pinned memory]: with ``find_unused_parameters=True`` or
``static_graph=True``, torch's C++ reducer copies its map of used parameters to
the parameters' device through pinned host memory
(``Reducer::all_reduce_local_used_map``); for a PrivateUse1 device it asks the
backend's C++ hooks for a pinned allocator, which a backend defined in Python
cannot provide (torch 2.13's Python ``PrivateUse1Hooks`` has no such method).
Left alone, the first ``backward()`` fails deep inside autograd with a message
about ``RegisterPrivateUse1HooksInterface``; instead ``DistributedDataParallel``
raises at construction, on every rank alike, naming the option and what to do.
"""

from __future__ import annotations

import functools

from torch.nn.parallel import DistributedDataParallel

_ADVICE = {
    "find_unused_parameters": "make every parameter take part in the loss (e.g. add 0.0 * p.sum() for the "
    "parameters a step skips) and leave find_unused_parameters=False",
    "static_graph": "leave static_graph=False (DDP then re-discovers the bucket order each step, which costs "
    "nothing in defer mode, where the whole step is one program)",
}


def _check(ddp, static_graph: bool) -> None:
    if ddp.device_type != "tpu":
        return
    for option, on in (("find_unused_parameters", ddp.find_unused_parameters), ("static_graph", static_graph)):
        if on:
            raise NotImplementedError(
                f"lazytpu: DistributedDataParallel({option}=True) is not supported on tpu: torch's reducer "
                f"needs a pinned host memory allocator for it, which a Python-defined device cannot provide "
                f"(Note [DDP and pinned memory]); {_ADVICE[option]}"
            )


def install() -> None:
    """Wrap ``DistributedDataParallel._ddp_init_helper`` with the check. Idempotent."""
    original = DistributedDataParallel._ddp_init_helper
    if getattr(original, "_lt_checked", False):
        return

    @functools.wraps(original)
    def _ddp_init_helper(self, parameters, expect_sparse_gradient, param_to_name_mapping, static_graph, *a, **k):
        _check(self, static_graph)
        return original(self, parameters, expect_sparse_gradient, param_to_name_mapping, static_graph, *a, **k)

    _ddp_init_helper._lt_checked = True
    DistributedDataParallel._ddp_init_helper = _ddp_init_helper
