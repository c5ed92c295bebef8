"""This machine's memory bandwidth, and the bandwidth floor of one decode step.

Decode at batch 1 is memory-bound: every step must read all weights plus the cache of
the context. floor = (weight bytes + cache bytes read per step) / bandwidth.
"""
from __future__ import annotations

import time

import torch


def measure_bandwidth(nbytes: int = 256 * 2**20, repeats: int = 7) -> float:
    """Bytes/s of a large tensor copy (counting read + write), median of `repeats`."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch pages before timing
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        dst.copy_(src)
        rates.append(2 * nbytes / (time.perf_counter() - start))
    rates.sort()
    return rates[len(rates) // 2]


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of distinct parameters (tied weights counted once), excluding the
    embedding table, of which decode reads one row per token."""
    seen, total = set(), 0
    embed = getattr(getattr(model, "model", model), "embed_tokens", None)
    embed_ptr = embed.weight.data_ptr() if embed is not None else None
    tied_head = getattr(model, "lm_head", None) is not None and model.lm_head.weight.data_ptr() == embed_ptr
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        if p.data_ptr() == embed_ptr and not tied_head:
            continue
        total += p.numel() * p.element_size()
    return total


def decode_floor_seconds(weights: int, cache_bytes_per_token: int, context: int, bandwidth: float) -> float:
    """Lower bound on one batch-1 decode step."""
    return (weights + cache_bytes_per_token * context) / bandwidth
