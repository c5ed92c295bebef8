"""Bits per cached direction: reverse water-filling on calibration energies (transform_code.py's format).

Each cached direction j of a layer (a latent direction, a rope-key dim) has an energy λ_j: the
attention-output error one unit of its variance's error causes, times its variance — so the
error of coding it at b bits is λ_j · DISTORTION[b] in one unit across directions, sides and
layers (the latent's own metric, convert/latent.py):
- latent direction i, in the PCA basis of the weighted factorization: its variance, the spectrum
  (the latent's metric is the identity there: Z ≈ M^-½ U c, so |δc|² is the weighted error);
- rope-key dim j (after RoPE: a pair's two dims averaged): E[k_j²] times the score error's
  reach, k_weight · Σ_h κ_h · scale² · E[q_hj²] (κ_h: calibrate.py; k_weight as the latent's K
  block; scale the softmax scale; q the converted rope query, whose scale folds √((dn+dr)/d)).
Minimizing Σ_j λ_j · DISTORTION[b_j] under a budget of bits: DISTORTION's decrements shrink
with b, so the best allocation takes the increments (j, b) of largest gain λ_j · (D[b-1] - D[b])
first — reverse water-filling, bits ~ ½ log2(λ_j / θ) — over every layer at once (layers and
sides differ as their energies do). The bytes also count the scales of the groups formed; the
largest prefix of increments whose bytes fit is taken.
"""

from __future__ import annotations

import torch

from latentkv.convert import transform_code as tc
from latentkv.convert.calibrate import LayerStats


def _augmented(tensors: dict, name: str) -> torch.Tensor:
    w = tensors[name + ".weight"].double()
    bias = tensors.get(name + ".bias")
    return torch.cat([w, (bias.double() if bias is not None else w.new_zeros(w.shape[0]))[:, None]], 1)


def pair_mean(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x [dr] -> each RoPE pair's two entries replaced by their mean (RoPE turns a pair's energy between them)."""
    if interleaved:
        return x.view(-1, 2).mean(-1).repeat_interleave(2)
    half = x.shape[0] // 2
    m = (x[:half] + x[half:]) / 2
    return torch.cat([m, m])


def layer_energies(cfg: dict, tensors: dict, layer: int, st: LayerStats, k_weight: float) -> tuple:
    """(latent λ [r], rope λ [dr]) of a converted layer (cfg: its config dict; tensors: by name)."""
    p = f"model.layers.{layer}.self_attn."
    ranks = cfg.get("latentkv", {}).get("kv_lora_ranks")
    r = ranks[layer] if ranks else cfg["kv_lora_rank"]
    dn, dr, H = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["num_attention_heads"]
    xx = st.xx.double()
    kv_a = _augmented(tensors, p + "kv_a_proj_with_mqa")
    second = ((kv_a @ xx) * kv_a).sum(-1)  # E[y²] of every output row
    latent, rope = second[:r], second[r:]
    q = _augmented(tensors, p + "q_proj").view(H, dn + dr, -1)[:, dn:]  # [H, dr, D+1]
    q2 = ((q @ xx) * q).sum(-1)  # [H, dr]
    reach = (st.kappa.double()[:, None] * q2).sum(0) * k_weight / (dn + dr)
    interleaved = cfg.get("rope_interleave", True)
    return latent.clamp(min=0), (pair_mean(reach, interleaved) * pair_mean(rope, interleaved)).clamp(min=0)


def allocate(
    energies: list[tuple[torch.Tensor, torch.Tensor]],
    kv_bytes: int,
    group: int = tc.GROUP,
    scale_bytes: int = tc.SCALE_BYTES,
) -> tc.TransformCode:
    """The bits of every direction of every layer (energies: (latent λ, rope λ) per layer) whose
    bytes per token fit kv_bytes; raises ValueError if not even one bit fits."""
    sizes = [(len(lat), len(rope)) for lat, rope in energies]
    flat = torch.cat([torch.cat([lat, rope]) for lat, rope in energies]).double()
    drops = torch.tensor([tc.DISTORTION[b - 1] - tc.DISTORTION[b] for b in range(1, tc.MAX_BITS + 1)], dtype=flat.dtype)
    gains = (flat[:, None] * drops[None, :]).reshape(-1)  # increment (j, b) at j * MAX_BITS + b - 1
    # stable sort on -gain: for one direction the increments stay in order of b (drops decrease)
    order = torch.sort(-gains, stable=True).indices
    owner = order // tc.MAX_BITS

    def code(k: int) -> tc.TransformCode:
        bits = torch.zeros(len(flat), dtype=torch.long).index_add_(0, owner[:k], torch.ones(k, dtype=torch.long))
        lat_bits, rope_bits, at = [], [], 0
        for r, dr in sizes:
            lat_bits.append(tuple(bits[at : at + r].tolist()))
            rope_bits.append(tuple(bits[at + r : at + r + dr].tolist()))
            at += r + dr
        return tc.TransformCode(tuple(lat_bits), tuple(rope_bits), group)

    def nbytes(c: tc.TransformCode) -> int:
        return sum(tc.layer_bytes(list(a), list(b), group, scale_bytes) for a, b in zip(c.latent_bits, c.rope_bits))

    lo, hi = 0, len(order)  # bytes grow with k (up to a scale's bytes where a group forms or goes)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if nbytes(code(mid)) <= kv_bytes:
            lo = mid
        else:
            hi = mid - 1
    while lo and nbytes(code(lo)) > kv_bytes:
        lo -= 1
    if lo == 0:
        raise ValueError(f"{kv_bytes} bytes per token hold no coded direction in {len(sizes)} layers")
    return code(lo)


def model_energies(cfg: dict, tensors: dict, stats: list[LayerStats], k_weight: float, rope_scale: float = 1.0):
    """layer_energies of every layer; rope_scale multiplies the rope key's (a K / latent balance to try)."""
    out = []
    for i, st in enumerate(stats):
        lat, rope = layer_energies(cfg, tensors, i, st, k_weight)
        out.append((lat, rope * rope_scale))
    return out
