"""Quantization-aware training's fake-quantization ops while recording: their
output metas (lazytpu.lowering.quantize computes them).

torch has no meta kernel for the fake quantizations: each call signature runs
the op once on CPU tensors of its shapes, so that what CPU raises is raised at
the call. The fused observer (``_fused_moving_avg_obs_fq_helper``, what
``FusedMovingAvgObsFakeQuantize``, the x86 QAT default, calls) resizes empty
per-channel statistics (a ``MovingAveragePerChannelMinMaxObserver`` starts
with none) to one per channel, where the meta kernel of its functional form
keeps them empty; its CPU errors come from the probe of its written arguments
(Note [Several written arguments] in lazytpu.frontend.routes.inplace).
"""

from __future__ import annotations

import torch

from lazytpu.lowering.quantize import FAKE_QUANTIZE

aten = torch.ops.aten


def _full(like, value):
    """A CPU tensor of ``like``'s layout (the outputs follow a channels-last input's) holding ``value``."""
    if not isinstance(like, torch.Tensor):
        return like
    return torch.empty_strided(like.shape, like.stride(), dtype=like.dtype).fill_(value)


def _fake_quantize(func):
    """The call on CPU tensors of its shapes: scales of ones, zero points at ``quant_min`` (a value check
    reads them), the rest zeros; the outputs shaped as CPU's."""
    names = [a.name for a in func._schema.arguments]

    def meta(*args, **kwargs):
        call = dict(zip(names, args), **kwargs)
        fills = {"scale": 1, "zero_point": call["quant_min"], "fake_quant_enabled": 1}
        cpu = func(**{name: _full(v, fills.get(name, 0)) for name, v in call.items()})
        return torch.utils._pytree.tree_map(lambda t: torch.empty_like(t, device="meta"), cpu)

    return meta


def _fused_observer(
    x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, averaging_const, quant_min, quant_max,
    ch_axis, per_row_fake_quant=False, symmetric_quant=False,
):  # fmt: skip
    """torch's meta kernel (its check of ``ch_axis``), with CPU's shapes of the new statistics."""
    out = aten._fused_moving_avg_obs_fq_helper_functional.default(
        x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point, averaging_const,
        quant_min, quant_max, ch_axis, per_row_fake_quant, symmetric_quant,
    )  # fmt: skip
    if not per_row_fake_quant:
        return out
    channels = x.shape[ch_axis]
    if running_min.numel() == 0:
        return (*out[:2], *(t.new_empty(channels) for t in out[2:]))
    if running_min.numel() != channels:
        raise RuntimeError(  # CPU's kernel writes past the statistics' end
            f"fused_moving_avg_obs_fake_quant: running_min has {running_min.numel()} elements; expected none or "
            f"one per channel ({channels} along dim {ch_axis})"
        )
    return out


SHAPES = {op: _fake_quantize(op) for op in FAKE_QUANTIZE}  # Note [Missing meta kernels] in metas
FIXES = {aten._fused_moving_avg_obs_fq_helper_functional.default: _fused_observer}  # Note [Meta shape fixes]
