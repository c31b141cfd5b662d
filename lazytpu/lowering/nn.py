"""Neural-network ops: activations, normalization, losses, embedding."""

from __future__ import annotations

import torch

aten = torch.ops.aten
