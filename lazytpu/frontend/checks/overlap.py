"""torch's refusals of writes that overlap their own inputs or themselves."""

from __future__ import annotations

import torch

from lazytpu import _caches
from lazytpu.frontend.checks.probe import cpu_probe, tensor_leaves
from lazytpu.frontend.tensor import LazyTensor

_OVERLAP_CHECKS = _caches.memo("overlap_checks")


def check_overlap(func, args, kwargs, written: LazyTensor) -> None:
    """Raise torch's error for a write into ``written`` that CPU torch refuses.

    Note [Overlapping writes]: torch refuses a write whose target has elements
    sharing memory (an expanded tensor) or that partially overlaps one of the
    op's inputs ("unsupported operation: ..."), and warns for some of them;
    meta kernels check neither. When the target could overlap (a zero stride,
    or another input on its storage), the op runs on CPU zeros with the same
    layouts and the same storage sharing, and its error is raised (its
    warnings reach the caller as torch's own). The outcome is cached per
    layout, except for a self-overlapping target, whose warnings repeat.
    """
    storage = written._lt_storage
    overlapping = 0 in written._lt_desc.stride and torch._debug_has_internal_overlap(written) == 1
    if not (overlapping or _shared(args, kwargs, storage)):
        return
    leaves = tensor_leaves((args, kwargs))
    groups = [next(i for i, u in enumerate(leaves) if u._lt_storage is t._lt_storage) for t in leaves]
    key = (func, tuple(t._lt_desc for t in leaves), tuple(groups))
    error = _OVERLAP_CHECKS.get(key, False)
    if error is False:
        error = cpu_probe(func, args, kwargs)
        if error is not None and not (
            issubclass(error[0], RuntimeError) and error[1].startswith("unsupported operation:")
        ):
            error = None
        if not overlapping:
            _OVERLAP_CHECKS[key] = error
    if error is not None:
        raise RuntimeError(error[1])


def _shared(args, kwargs, storage) -> bool:
    """Whether an argument other than the target is on ``storage`` (the
    target itself as another argument too): the common calls, a tensor and
    numbers, are answered without collecting the leaves."""
    uses = 0
    for x in (*args, *kwargs.values()):
        if type(x) is LazyTensor:
            uses += x._lt_storage is storage
        elif isinstance(x, (list, tuple, dict)):
            uses += sum(t._lt_storage is storage for t in tensor_leaves(x))
    return uses > 1
