"""More neural-network ops: im2col/col2im (``F.unfold``/``F.fold``).

Note [im2col order]: torch's ``im2col`` lays a patch out channel-major, then
kernel row, then kernel column (row ``c * kh * kw + i * kw + j``), and the
blocks in row-major order of their top-left corners. ``col2im`` is its
adjoint: every column entry is added back where ``im2col`` read it.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


def _blocks(size: int, k: int, d: int, p: int, s: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _taps(spatial, kernel_size, dilation, padding, stride):
    """The blocks' grid ``(oh, ow)`` and, for each kernel tap (i, j), the
    strided 2-d slice of the padded input it reads."""
    (k0, k1), (d0, d1), (s0, s1) = kernel_size, dilation, stride
    o0 = _blocks(spatial[0], k0, d0, padding[0], s0)
    o1 = _blocks(spatial[1], k1, d1, padding[1], s1)
    taps = [
        (slice(i * d0, i * d0 + (o0 - 1) * s0 + 1, s0), slice(j * d1, j * d1 + (o1 - 1) * s1 + 1, s1))
        for i in range(k0)
        for j in range(k1)
    ]
    return (o0, o1), taps


def _pads(x, padding):
    return ((0, 0),) * (x.ndim - 2) + ((padding[0], padding[0]), (padding[1], padding[1]))


@lowering(aten.im2col.default)
def im2col(x, kernel_size, dilation, padding, stride):
    """Note [im2col order]."""
    padded = jnp.pad(x, _pads(x, padding))
    (o0, o1), taps = _taps(x.shape[-2:], kernel_size, dilation, padding, stride)
    stacked = jnp.stack([padded[..., r, c] for r, c in taps], axis=-3)  # (..., C, kh * kw, oh, ow)
    return stacked.reshape(x.shape[:-3] + (x.shape[-3] * len(taps), o0 * o1))


@lowering(aten.col2im.default)
def col2im(cols, output_size, kernel_size, dilation, padding, stride):
    """Note [im2col order]: the adjoint of ``im2col``."""
    (o0, o1), taps = _taps(tuple(output_size), kernel_size, dilation, padding, stride)
    lead = cols.shape[:-2]
    channels = cols.shape[-2] // len(taps)
    out = jnp.zeros(lead + (channels, output_size[0] + 2 * padding[0], output_size[1] + 2 * padding[1]), cols.dtype)
    blocks = cols.reshape(lead + (channels, len(taps), o0, o1))
    for t, (r, c) in enumerate(taps):
        out = out.at[..., r, c].add(blocks[..., t, :, :])
    return out[..., padding[0] : out.shape[-2] - padding[0], padding[1] : out.shape[-1] - padding[1]]
