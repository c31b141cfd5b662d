"""Fast Fourier transforms: torch's three FFT primitives.

Every ``torch.fft.*`` function (and ``stft``/``istft``) is CompositeImplicit
over ``_fft_r2c`` (real to complex), ``_fft_c2r`` (complex to real) and
``_fft_c2c``; the normalization is an int chosen by the caller, applied as
is in either direction: 0 none, 1 ``1/sqrt(n)``, 2 ``1/n``, where ``n`` is
the product of the signal sizes over the transformed dims. The rules ask JAX
for unnormalized transforms and scale afterwards.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _scaled(x, normalization: int, sizes):
    n = math.prod(sizes)
    if normalization == 0 or n == 0:
        return x
    return x * (1 / math.sqrt(n) if normalization == 1 else 1 / n)


def _axes(x, dim) -> tuple:
    return tuple(d % x.ndim for d in dim)


@lowering(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    ax = _axes(x, dim)
    out = jnp.fft.rfftn(x, axes=ax) if onesided else jnp.fft.fftn(x, axes=ax)
    return _scaled(out, normalization, [x.shape[a] for a in ax])


@lowering(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    ax = _axes(x, dim)
    sizes = [x.shape[a] for a in ax[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(x, s=sizes, axes=ax, norm="forward")  # "forward": the inverse is unscaled
    return _scaled(out, normalization, sizes)


@lowering(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    ax = _axes(x, dim)
    out = jnp.fft.fftn(x, axes=ax) if forward else jnp.fft.ifftn(x, axes=ax, norm="forward")
    return _scaled(out, normalization, [x.shape[a] for a in ax])
