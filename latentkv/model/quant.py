"""Weight-only int8 linears for memory-bound decode: per-output-channel scales
(`scale = max|w| / 127`), int8 weights, activations left in the model dtype.
Half the weight bytes of bf16, so a batch-1 decode step reads half as much."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SKIP = ("kv_b_proj",)  # the absorbed path reads W_UK / W_UV directly; keep them exact


class Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127
        self.register_buffer("weight_int8", (w / scale[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(linear.weight.dtype))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.device.type == "cpu" and self.in_features % 16 == 0:
            # ATen's AVX-512/AVX2 int8 kernel (it returns garbage when K is not a multiple of 16)
            y = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scales.to(flat.dtype))
        else:
            y = F.linear(flat, self.weight_int8.to(flat.dtype)) * self.scales.to(flat.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


def quantize_linears(model: nn.Module) -> int:
    """Replace every nn.Linear (but kv_b_proj) with an Int8Linear in place; returns how many."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, nn.Linear) and name not in SKIP:
                setattr(parent, name, Int8Linear(child))
                count += 1
    return count
