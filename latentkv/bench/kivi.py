"""KIVI-style quantized KV caches of the original, for `bench frontier` (llama.cpp has none).

KIVI (Liu et al., 2024) quantizes keys per channel (each channel's values over a group of tokens
share a scale and a zero point) and values per token (each token's values over a group of channels
share them), asymmetric, at 2-4 bits. Here in the original's float32 reference forward: K (after
RoPE) and V [B, Hkv, T, d] are each taken through their quantizer and back. Not KIVI's full
method: its window of recent tokens kept in full precision is left out (every token is quantized;
the last group of tokens, however short, gets its own scale), so these rows are a little pessimistic
for KIVI at short contexts, and their bytes are exactly the codes and the float16 scale and zero of
every group.
"""

from __future__ import annotations

import torch

# (bits, tokens per key group, channels per value group): the rows `bench frontier --systems kivi` measures
VARIANTS = ((4, 32, 32), (3, 32, 32), (2, 32, 32), (2, 128, 128))
GROUP_BYTES = 4  # a float16 scale and a float16 zero point


def quantize(x: torch.Tensor, bits: int, dim: int, group: int) -> torch.Tensor:
    """x taken through asymmetric `bits`-bit codes with a float16 scale and zero per `group` entries
    along `dim` (the last group may be shorter), read back in x's dtype."""
    n = x.shape[dim]
    moved = x.movedim(dim, -1)
    pad = -n % group
    padded = torch.nn.functional.pad(moved.float(), (0, pad))
    g = padded.view(*padded.shape[:-1], -1, group)
    valid = torch.nn.functional.pad(torch.ones(n, dtype=torch.bool, device=x.device), (0, pad)).view(-1, group)
    lo = torch.where(valid, g, float("inf")).amin(-1, keepdim=True).half().float()
    hi = torch.where(valid, g, float("-inf")).amax(-1, keepdim=True)
    scale = ((hi - lo) / (2**bits - 1)).half().float()
    codes = torch.round((g - lo) / torch.where(scale > 0, scale, 1)).clamp(0, 2**bits - 1)
    out = (codes * scale + lo).view(*padded.shape)[..., :n]
    return out.to(x.dtype).movedim(-1, dim)


def round_trips(bits: int, key_group: int, value_group: int):
    """(key store, value store) for the reference forward: k per channel over tokens, v per token over channels."""
    return (lambda k: quantize(k, bits, -2, key_group), lambda v: quantize(v, bits, -1, value_group))


def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, bits: int, key_group: int, value_group: int):
    """Codes of K and V, a key group's scale and zero shared by key_group tokens, a value group's per token."""
    width = num_kv_heads * head_dim
    per_layer = 2 * width * bits / 8 + width * GROUP_BYTES / key_group + width / value_group * GROUP_BYTES
    return round(num_layers * per_layer)


def label(bits: int, key_group: int, value_group: int) -> str:
    return f"KIVI-style {bits}-bit (K per channel / {key_group} tokens, V per token / {value_group} channels)"
