"""This machine's memory bandwidth, and the bandwidth floor of one decode step.

Decode at batch 1 is memory-bound: every step must read all weights plus the cache of
the context. floor = (weight bytes + cache bytes read per step) / bandwidth.
"""

from __future__ import annotations

import itertools
from pathlib import Path
import time

import torch


def llc_bytes() -> int:
    """The largest CPU cache (Linux sysfs), or 32 MiB where it cannot be read."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        if text.rstrip("KMG").isdigit():
            sizes.append(int(text.rstrip("KMG")) * scale)
    return max(sizes, default=32 * 2**20)


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
    """Bytes of distinct weights one batch-1 decode step reads: of a MoE layer's routed experts, the
    num_experts_per_tok of n_routed_experts one token reads (step_weight_bytes has the rest)."""
    layers = sum(1 for _ in moe_expert_lists(model))
    return step_weight_bytes(model, [model.config.num_experts_per_tok] * layers)


def step_weight_bytes(model: torch.nn.Module, touched: list[int]) -> int:
    """Bytes of distinct weights a decode step reads when its tokens route to touched[i] routed
    experts of the i-th MoE layer (in module order): parameters and the buffers of quantized linears
    (as stored), tied weights once; not the embedding table (decode reads a row of it per token) unless
    it doubles as an unquantized output head; of each MoE layer's experts, the touched ones' share."""
    embed = model.model.embed_tokens.weight
    head = getattr(model.lm_head, "weight", None)
    head_is_embed = head is not None and head.data_ptr() == embed.data_ptr()
    seen, total = set(), 0
    for t in itertools.chain(model.parameters(), model.buffers()):
        if t.data_ptr() in seen or (t.data_ptr() == embed.data_ptr() and not head_is_embed):
            continue
        seen.add(t.data_ptr())
        total += tensor_bytes(t)
    experts = list(moe_expert_lists(model))
    if len(touched) != len(experts):
        raise ValueError(f"{len(touched)} counts of touched experts for {len(experts)} MoE layers")
    for layer, used in zip(experts, touched):
        stored = sum(tensor_bytes(t) for t in itertools.chain(layer.parameters(), layer.buffers()))
        total -= int(stored * (1 - used / len(layer)))
    return total


def moe_expert_lists(model: torch.nn.Module):
    """Each MoE layer's routed experts (a ModuleList), in module order."""
    if not model.config.n_routed_experts:
        return
    for module in model.modules():
        experts = getattr(module, "experts", None)
        if isinstance(experts, torch.nn.ModuleList):
            yield experts


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def decode_floor_seconds(weights: int, cache_bytes_per_token: int, context: int, bandwidth: float) -> float:
    """Lower bound on one batch-1 decode step."""
    return (weights + cache_bytes_per_token * context) / bandwidth
