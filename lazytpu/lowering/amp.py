"""Gradient scaling: the two ops ``torch.amp.GradScaler`` runs at every step.

Note [GradScaler ops]: ``GradScaler.unscale_`` calls
``_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)``
and ``GradScaler.update`` calls ``_amp_update_scale_(scale, growth_tracker,
found_inf, growth_factor, backoff_factor, growth_interval)``. Both write
several arguments in place; their functional forms, lowered here, return the
new values of those arguments in schema order, and the in-place route writes
them back (``routes.inplace``). The formulas are CPU torch's
(``aten/src/ATen/native/cpu/AmpGradScalerKernels.cpp``):

- unscale: each gradient times ``inv_scale`` (in float32 for halves, in
  float64 for doubles); ``found_inf`` becomes 1.0 if any gradient holds an
  inf or a nan, and is kept otherwise (the caller zeroes it);
- update: a nonzero ``found_inf`` multiplies the scale by the backoff factor
  and zeroes the tracker; otherwise the tracker counts the step, and when it
  reaches ``growth_interval`` the scale grows (unless that overflows float32)
  and the tracker restarts at 0. The products are computed in double, as the
  kernel's ``float * double``, then rounded to float32.

Nothing is read on the host: the scaler's own ``found_inf.item()`` in
``GradScaler.step`` is the only sync they leave.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _compute_dtype(dtype):
    """float32 for halves and float32, float64 for float64 (the kernel's ``opmath`` type times a float)."""
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


@lowering(aten._amp_foreach_non_finite_check_and_unscale.default)
def amp_unscale(grads, found_inf, inv_scale):
    """``(*unscaled grads, found_inf)`` (Note [GradScaler ops])."""
    inv = inv_scale.reshape(())
    found = jnp.zeros((), jnp.bool_)
    unscaled = []
    for g in grads:
        wide = g.astype(_compute_dtype(g.dtype))
        found = found | ~jnp.all(jnp.isfinite(wide))
        unscaled.append(wide * inv.astype(wide.dtype))
    return (*unscaled, jnp.where(found, jnp.ones_like(found_inf), found_inf))


@lowering(aten._amp_update_scale.default)
def amp_update_scale(scale, growth_tracker, found_inf, scale_growth_factor, scale_backoff_factor, growth_interval):
    """``(scale, growth_tracker)`` updated (Note [GradScaler ops])."""
    found = found_inf.reshape(()) != 0
    current = scale.reshape(()).astype(jnp.float64)
    successful = growth_tracker.reshape(()) + 1
    grow = successful == growth_interval
    grown = (current * scale_growth_factor).astype(jnp.float32)
    backed_off = (current * scale_backoff_factor).astype(jnp.float32)
    kept = jnp.where(grow & jnp.isfinite(grown), grown, scale.reshape(()))
    new_scale = jnp.where(found, backed_off, kept)
    new_tracker = jnp.where(found | grow, jnp.zeros_like(successful), successful)
    return new_scale.reshape(scale.shape), new_tracker.reshape(growth_tracker.shape)
