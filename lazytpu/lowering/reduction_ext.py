"""Closeness, counting and histograms with static bin counts.

Note [Closeness]: ``isclose`` follows torch's formula in the inputs' dtype:
``x == y``, or (with ``equal_nan``) both NaN, or a finite
``|x - y| <= atol + |rtol * y|``. ``rtol``/``atol`` may be runtime values
(lifted scalars), so the zero-tolerance shortcut torch takes is folded into
the formula (it gives the same answer).
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazytpu import _dtypes
from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


@lowering(aten.isclose)
def isclose(x, y, rtol=1e-05, atol=1e-08, equal_nan=False):
    close = x == y
    if jnp.issubdtype(x.dtype, jnp.inexact):
        if equal_nan:
            close = close | (jnp.isnan(x) & jnp.isnan(y))
        dtype = x.dtype
        error = jnp.abs(x - y)
    else:  # integers and bools: the error in the default float dtype
        dtype = _dtypes.to_jax(_dtypes.default_float())
        error = jnp.abs(x.astype(jnp.int64) - y.astype(jnp.int64)).astype(dtype)
    allowed = jnp.asarray(atol, dtype) + jnp.abs(jnp.asarray(rtol, dtype) * y.astype(dtype))
    return close | (jnp.isfinite(error) & (error <= allowed))
