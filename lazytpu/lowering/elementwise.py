"""Elementwise arithmetic, math, comparisons and logic."""

from __future__ import annotations

import torch

from lazytpu.lowering.registry import lowering

aten = torch.ops.aten


@lowering(aten.add.Tensor, aten.add.Scalar)
def add(x, y, *, alpha=1):
    return x + y * alpha if alpha is not None else x + y


@lowering(aten.mul.Tensor, aten.mul.Scalar)
def mul(x, y):
    return x * y
