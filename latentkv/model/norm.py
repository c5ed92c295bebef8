"""RMSNorm as DeepSeek and transformers compute it (statistics in float32): one native call
(model/fused.py) where the route runs the fused ops, else F.rms_norm."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import fused


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, kernel: bool = False):
        """kernel: the route runs the fused ops (Route.fused)."""
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.kernel = kernel

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """x [..., d] / rms(x) * weight; with `residual`: (x + residual, its norm) in one pass."""
        return fused.rms_norm(x, self.weight, self.eps, residual, kernel=self.kernel)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., d] / rms(x) * weight [d] (the converter's reference: always F.rms_norm)."""
    # F.rms_norm accumulates in float32 for low-precision inputs; one op instead of seven
    return F.rms_norm(x, weight.shape, weight, eps)
