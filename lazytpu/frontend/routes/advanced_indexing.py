"""Advanced indexing at the call: ``x[idx]``, ``x[mask]``, ``x[idx] = v`` (Note [Advanced indexing]).

Note [Advanced indexing]: aten's ``index`` and ``index_put`` take a list of
optional index tensors, which torch's kernels check before reading any data
(``make_info`` in ATen's IndexingUtils.h): at most one entry per dimension;
long, int, byte or bool dtypes; masks (bool, or uint8 with a deprecation
warning) whose sizes match the dimensions they cover; index tensors that
broadcast together; for ``index_put``, a value that broadcasts to the
indexing result and has the tensor's dtype, unless the call fills one mask
with one element (``masked_fill_``, which refuses a uint8 mask). Meta kernels
check little of this, and a mask's number of True elements is data, so the
checks are made here, with torch's messages, in torch's order:

- ``index`` with a mask has a data-dependent shape: it runs where the data is
  (Note [Data-dependent shapes]), on CPU torch with the real values, so that
  its result, errors and warning are CPU's;
- ``index_put`` with one mask and no index tensor beside it is recorded as it
  is: its lowering writes the k-th True position with the value's k-th row,
  reading nothing. Only a value with one row per True position (not one
  broadcast row) needs the count of True elements for torch's shape check: a
  host read of the mask (a sync if the mask is pending);
- ``index_put`` with several masks, or a mask beside index tensors, expands
  its masks to integer indices (``nonzero``, a sync), as torch does.
"""

from __future__ import annotations

import torch

from lazytpu import _caches
from lazytpu._dtypes import type_name
from lazytpu.frontend import hostio
from lazytpu.frontend.routes.fallback import cpu_fallback
from lazytpu.frontend.tensor import LazyTensor

aten = torch.ops.aten

# Advanced indexing takes index tensors on the CPU for a tensor of any
# device, as on CUDA (``x[torch.randperm(n)]``, ``x[idx] = v``); other ops
# with index arguments (``index_select``, ``gather``) raise torch's device error.
INDEX_OPS = frozenset(
    {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
)

_MASKS = (torch.bool, torch.uint8)
_INDEX_DTYPES = frozenset({torch.int64, torch.int32, torch.uint8, torch.bool})

# Calls already checked that hold no mask, by their signature (``_check_key``)
_CHECKED = _caches.memo("indexing_checked")


def prepare_indexing(func, args, kwargs) -> tuple[tuple, object]:
    """``(args, None)``, the call's arguments to record (CPU indices moved,
    masks checked or expanded), or ``(args, out)`` when the op ran where its
    data is (Note [Advanced indexing])."""
    key = _check_key(func, args, kwargs)
    if key in _CHECKED:  # the common case: one tuple and one set lookup
        return args, None
    self = args[0]
    indices = [_on_device(i, self) for i in args[1]]
    args = (self, indices, *args[2:])
    masked = any(i is not None and i.dtype in _MASKS for i in indices)
    if func is aten.index.Tensor:
        if masked:
            return args, cpu_fallback(func, args, kwargs, data_dependent=True)
        if len(indices) <= self.dim() and _index_dtypes_allowed(indices):  # else meta's errors
            _result_shape(self, [None if i is None else tuple(i.shape) for i in indices])
            _remember(key)
        return args, None
    values = args[2]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    if len(indices) > self.dim():
        raise IndexError(f"too many indices for tensor of dimension {self.dim()} (got {len(indices)})")
    fills = not accumulate and values.numel() == 1 and _fills_one_mask(self, indices)
    if not _index_dtypes_allowed(indices):
        raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
    if not masked:
        _check_put(self, [None if i is None else tuple(i.shape) for i in indices], values, fills)
        _remember(key)
        return args, None
    indices = _bool_masks(self, indices)
    alone = _lone_mask(indices)
    if alone is None:
        indices = _expanded(indices)
        _check_put(self, [None if i is None else tuple(i.shape) for i in indices], values, fills)
    else:
        _check_lone_mask(self, indices, alone, values, fills)
    return (self, indices, *args[2:]), None


def _remember(key) -> None:
    if key is not None:
        _CHECKED.add(key)


def _check_key(func, args, kwargs) -> tuple | None:
    """What decides the checks of a call: the op, its tensors' interned
    descriptions and its flags; None for a call with a CPU tensor (never cached)."""
    parts = [func, args[0]._lt_desc]
    for group in (args[1], args[2:3]):
        for i in group:
            if type(i) is LazyTensor:
                parts.append(i._lt_desc)
            elif i is None:
                parts.append(None)
            else:
                return None
    parts.extend(args[3:])
    if kwargs:
        parts.extend(sorted(kwargs.items()))
    return tuple(parts)


def _index_dtypes_allowed(indices) -> bool:
    return all(i is None or i.dtype in _INDEX_DTYPES for i in indices)


def _on_device(index, self):
    if isinstance(index, torch.Tensor) and type(index) is not LazyTensor and index.dim():
        return index.to(self.device)
    return index


def _fills_one_mask(self, indices) -> bool:
    """torch's ``canDispatchToMaskedFill``: a one-element value and one mask
    (None entries only beside it) is ``self.masked_fill_(mask, value)``, which
    checks the mask's sizes and refuses a uint8 mask."""
    mask, position = None, 0
    for index in indices:
        if index is None:
            position += mask is None
            continue
        if index.dtype not in _MASKS or mask is not None:
            return False
        mask = index
        _check_mask_sizes(self, mask, position)
        position += mask.dim()
    if mask is not None and mask.dtype == torch.uint8:
        raise RuntimeError("masked_fill_ only supports boolean masks, but got mask with dtype unsigned char")
    return mask is not None


def _check_mask_sizes(self, mask, position: int) -> None:
    for j in range(mask.dim()):
        size = torch.empty(self.shape, device="meta").size(position + j)  # torch's error past the last dim
        if mask.shape[j] != size:
            raise IndexError(
                f"The shape of the mask {list(mask.shape)} at index {j} does not match the shape of the indexed "
                f"tensor {list(self.shape)} at index {position + j}"
            )


def _bool_masks(self, indices) -> list:
    """torch's ``expandTensors`` up to ``nonzero``, in its order: each mask's
    sizes checked, a uint8 mask warned of and made a bool one."""
    out, position = [], 0
    for index in indices:
        if index is not None and index.dtype in _MASKS:
            if index.dtype == torch.uint8:
                _warn_uint8()
                index = index.bool()
            _check_mask_sizes(self, index, position)
            position += index.dim()
        else:
            position += 1
        out.append(index)
    return out


def _warn_uint8() -> None:
    """torch's own deprecation warning (its text names the C++ line that warns)."""
    aten.index.Tensor(torch.empty(0), [torch.empty(0, dtype=torch.uint8)])


def _lone_mask(indices) -> int | None:
    """The position of the only index tensor, if it is a mask (of one dim or more)."""
    given = [p for p, i in enumerate(indices) if i is not None]
    if len(given) == 1 and indices[given[0]].dtype == torch.bool and indices[given[0]].dim():
        return given[0]
    return None


def _expanded(indices) -> list:
    """Masks replaced by the integer indices of their True elements (a sync)."""
    out = []
    for index in indices:
        if index is not None and index.dtype == torch.bool:
            nonzero = aten.nonzero.default(index)
            out.extend(aten.select.int(nonzero, 1, j) for j in range(index.dim()))
        else:
            out.append(index)
    return out


def _check_lone_mask(self, indices, position: int, values, fills: bool) -> None:
    """torch's value checks for ``x[..., mask] = values``; the count of True
    elements is read only if the value's shape depends on it."""
    mask = indices[position]
    before = [None] * position
    after = [None] * (len(indices) - position - 1)

    def shapes(count):
        return before + [(count,)] * mask.dim() + after

    some = 1 if mask.numel() else 0  # a count of True elements that stands for any (an empty mask has none)
    result = _result_shape(self, shapes(some))
    row = values.dim() - (len(result) - position)  # the value's dim that meets the True elements
    if fills or (_expandable(values.shape, result) and (row < 0 or values.shape[row] == 1)):
        _check_put(self, shapes(some), values, fills)
        return
    count = int(hostio.to_cpu(mask, "data_dependent").sum())
    _check_put(self, shapes(count), values, fills)


def _check_put(self, shapes: list, values, fills: bool) -> None:
    """torch's ``make_info`` and ``make_index_put_iterator`` checks, on the
    shapes of integer index tensors (None for a whole dimension)."""
    result = _result_shape(self, shapes)
    if fills:
        return
    if not _expandable(values.shape, result):
        raise RuntimeError(
            f"shape mismatch: value tensor of shape {list(values.shape)} cannot be broadcast to indexing result "
            f"of shape {list(result)}"
        )
    if values.dtype != self.dtype:
        raise RuntimeError(
            "Index put requires the source and destination dtypes match, got "
            f"{type_name(self.dtype)} for the destination and {type_name(values.dtype)} for the source."
        )


def _result_shape(self, shapes: list) -> tuple:
    """The shape of ``self[indices]`` for index tensors of these shapes
    (torch's ``AdvancedIndex``: the indexed dims are replaced by the
    broadcast index shape, moved to the front if they are not adjacent)."""
    given = [s for s in shapes if s is not None]
    try:
        index_shape = tuple(torch.broadcast_shapes(*given))
    except RuntimeError:
        shown = ", ".join(str(list(s)) for s in given)
        raise IndexError(
            f"shape mismatch: indexing tensors could not be broadcast together with shapes {shown}"
        ) from None
    shapes = shapes + [None] * (self.dim() - len(shapes))
    sizes = [torch.empty(self.shape, device="meta").size(d) for d in range(len(shapes))]
    placed = [d for d, s in enumerate(shapes) if s is not None]
    if not placed:
        return tuple(self.shape)
    if 0 in [sizes[d] for d in placed] and 0 not in index_shape:  # no index is valid for an empty dim
        raise IndexError("index is out of bounds for dimension with size 0")
    rest = [sizes[d] for d, s in enumerate(shapes) if s is None]
    if placed == list(range(placed[0], placed[-1] + 1)):
        first = placed[0]
        return (*sizes[:first], *index_shape, *sizes[placed[-1] + 1 :])
    return (*index_shape, *rest)


def _expandable(shape, target) -> bool:
    """torch's ``is_expandable_to``."""
    if len(shape) > len(target):
        return False
    return all(s == t or s == 1 for s, t in zip(reversed(shape), reversed(target)))
