"""The ordering barrier: values passed through unchanged, computed after a tie
and never merged with what came before (Note [Recomputation barrier] in
lazytpu.device.checkpoint).

``lazytpu.optimization_barrier(*values, tie)`` returns ``values``. XLA may not
common-subexpression-eliminate ops on its outputs with ops on its inputs,
and, with ``tied``, its outputs exist only once the last input, ``tie``, is
computed. On TPU and GPU that is ``lax.optimization_barrier`` over the values
and the tie, which their schedulers keep. XLA:CPU removes optimization
barriers before its last CSE and its scheduling (measured: a rematerialized
matmul merged back into the forward pass, and recomputations scheduled at the
start of the backward pass), so there the values go through a conditional
whose predicate reads the tie: a real data dependency that no pass removes.
The predicate, ``t == t or t != t``, is true for every value of ``t``
(NaN included), so the other branch never runs.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from lazytpu.lowering.registry import lowering

OPTIMIZATION_BARRIER = "lazytpu.optimization_barrier"


def _barrier(*values):
    return lax.optimization_barrier(values)[:-1]


def _conditional(*values):
    *values, tie = values
    t = tie.reshape(-1)[0]
    return lax.cond((t == t) | (t != t), lambda vs: vs, lambda vs: tuple(jnp.zeros_like(v) for v in vs), tuple(values))


@lowering(OPTIMIZATION_BARRIER)
def optimization_barrier(*values, tied: bool):
    """``values`` unchanged; with ``tied``, the last one is the tie (not returned)."""
    if not tied:
        return lax.optimization_barrier(values)
    return tuple(lax.platform_dependent(*values, cpu=_conditional, default=_barrier))
