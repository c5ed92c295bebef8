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
first — reverse water-filling, bits ~ ½ log2(λ_j / θ). The bytes also count the scales of the
groups formed; the largest prefix of increments whose bytes fit is taken.

ALLOCATIONS, each a candidate of `convert --kv-bytes` (budget.py), scored by agreement:
- uniform: the floor, no allocation — each layer's latent (V side) and rope key (K side) at one
  rate, their even share of the bytes (`side_budgets`);
- sides: within each side at the floor's budget, water-filling on the side's own energies (one
  metric within a side; across layers and sides the first-order unit misjudges whole sides);
- global: one water-filling over every layer at once (`allocate`). On the bundled model it gives
  layer 0's latent no bits from 37.5% of the f16 cache down, and agreement collapses.
"""

from __future__ import annotations

import torch

from latentkv.cache import transform_code as tc
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


def layer_means(cfg: dict, tensors: dict, layer: int, st: LayerStats) -> tuple[torch.Tensor, torch.Tensor]:
    """(latent mean [r], rope-key mean [dr] before RoPE) of a converted layer: its cache's per-direction
    offsets over the calibration, what a centred code codes its rows less (transform_code.py)."""
    kv_a = _augmented(tensors, f"model.layers.{layer}.self_attn.kv_a_proj_with_mqa")
    mean = kv_a @ st.xx.double()[:, -1]  # x̃'s last entry is 1: E[x̃ x̃ᵀ]'s last column is E[x̃]
    r = _rank(cfg, layer)
    return mean[:r].float(), mean[r:].float()


def _rank(cfg: dict, layer: int) -> int:
    ranks = cfg.get("latentkv", {}).get("kv_lora_ranks")
    return ranks[layer] if ranks else cfg["kv_lora_rank"]


def layer_energies(cfg: dict, tensors: dict, layer: int, st: LayerStats, k_weight: float, centred: bool = False):
    """(latent λ [r], rope λ [dr]) of a converted layer (cfg: its config dict; tensors: by name);
    centred: of its rows less their means (layer_means)."""
    p = f"model.layers.{layer}.self_attn."
    r = _rank(cfg, layer)
    dn, dr, H = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["num_attention_heads"]
    xx = st.xx.double()
    kv_a = _augmented(tensors, p + "kv_a_proj_with_mqa")
    second = ((kv_a @ xx) * kv_a).sum(-1)  # E[y²] of every output row
    if centred:
        second = second - (kv_a @ xx[:, -1]) ** 2  # its variance
    latent, rope = second[:r], second[r:]
    q = _augmented(tensors, p + "q_proj").view(H, dn + dr, -1)[:, dn:]  # [H, dr, D+1]
    q2 = ((q @ xx) * q).sum(-1)  # [H, dr]
    reach = (st.kappa.double()[:, None] * q2).sum(0) * k_weight / (dn + dr)
    interleaved = cfg.get("rope_interleave", True)
    return latent.clamp(min=0), (pair_mean(reach, interleaved) * pair_mean(rope, interleaved)).clamp(min=0)


def _largest_prefix(flat: torch.Tensor, fits) -> torch.Tensor:
    """The bits [n] of the largest prefix of increments (j, b), taken in order of gain
    flat_j · (D[b-1] - D[b]), that `fits(bits)` accepts (all zeros if none does)."""
    drops = torch.tensor([tc.DISTORTION[b - 1] - tc.DISTORTION[b] for b in range(1, tc.MAX_BITS + 1)], dtype=flat.dtype)
    gains = (flat[:, None] * drops[None, :]).reshape(-1)  # increment (j, b) at j * MAX_BITS + b - 1
    # stable sort on -gain: for one direction the increments stay in order of b (drops decrease)
    owner = torch.sort(-gains, stable=True).indices // tc.MAX_BITS

    def bits(k: int) -> torch.Tensor:
        return torch.zeros(len(flat), dtype=torch.long).index_add_(0, owner[:k], torch.ones(k, dtype=torch.long))

    lo, hi = 0, len(owner)  # the cost grows with k (up to a scale's bytes where a group forms or goes)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(bits(mid)):
            lo = mid
        else:
            hi = mid - 1
    while lo and not fits(bits(lo)):
        lo -= 1
    return bits(lo)


def _code(flat_bits: list[int], sizes: list[tuple[int, int]], group: int) -> tc.TransformCode:
    lat_bits, rope_bits, at = [], [], 0
    for r, dr in sizes:
        lat_bits.append(tuple(flat_bits[at : at + r]))
        rope_bits.append(tuple(flat_bits[at + r : at + r + dr]))
        at += r + dr
    return tc.TransformCode(tuple(lat_bits), tuple(rope_bits), group)


def allocate(
    energies: list[tuple[torch.Tensor, torch.Tensor]],
    kv_bytes: int,
    group: int = tc.GROUP,
    scale_bytes: int = tc.SCALE_BYTES,
) -> tc.TransformCode:
    """The bits of every direction of every layer (energies: (latent λ, rope λ) per layer) whose
    bytes per token fit kv_bytes, water-filled over all layers at once; raises ValueError if not
    even one bit fits."""
    sizes = [(len(lat), len(rope)) for lat, rope in energies]
    flat = torch.cat([torch.cat([lat, rope]) for lat, rope in energies]).double()

    def fits(bits: torch.Tensor) -> bool:
        code = _code(bits.tolist(), sizes, group)
        return (
            sum(tc.layer_bytes(list(a), list(b), group, scale_bytes) for a, b in zip(code.latent_bits, code.rope_bits))
            <= kv_bytes
        )

    bits = _largest_prefix(flat, fits)
    if not bits.any():
        raise ValueError(f"{kv_bytes} bytes per token hold no coded direction in {len(sizes)} layers")
    return _code(bits.tolist(), sizes, group)


def side_budgets(sizes: list[tuple[int, int]], kv_bytes: int) -> list[tuple[int, int]]:
    """(latent bits, rope-key bits) each layer's sides may take, scales included: kv_bytes shared
    evenly by layers and, within a layer, by directions (the budget of the uniform code)."""
    out = []
    for i, (r, dr) in enumerate(sizes):
        layer_bits = 8 * (kv_bytes // len(sizes) + (i < kv_bytes % len(sizes)))
        latent = layer_bits * r // (r + dr)
        out.append((latent, layer_bits - latent))
    return out


def side_bits(bits: list[int], group: int = tc.GROUP, scale_bytes: int = tc.SCALE_BYTES) -> int:
    """Bits one side's directions take per token: their codes and a scale per group."""
    code_bits, scales = tc.side_cost(bits, group)
    return code_bits + 8 * scale_bytes * scales


def uniform_side(n: int, budget: int, group: int = tc.GROUP, scale_bytes: int = tc.SCALE_BYTES) -> list[int]:
    """The uniform code of one side within `budget` bits: every direction at b bits, the first runs
    of `group` at b + 1 as far as the budget goes (the most bits every direction can share); below
    one bit a direction, the first directions at 1 bit and the rest dropped."""
    for b in range(tc.MAX_BITS, 0, -1):
        if side_bits([b] * n, group, scale_bytes) <= budget:
            best = [b] * n
            for m in range(group, n, group):
                more = [b + 1] * m + [b] * (n - m)
                if b == tc.MAX_BITS or side_bits(more, group, scale_bytes) > budget:
                    break
                best = more
            return best
    m = n
    while m and side_bits([1] * m, group, scale_bytes) > budget:
        m -= 1
    return [1] * m + [0] * (n - m)


def waterfill_side(energy: torch.Tensor, budget: int, group: int = tc.GROUP, scale_bytes: int = tc.SCALE_BYTES):
    """One side's bits within `budget` bits by reverse water-filling on its energies [n]."""
    return _largest_prefix(
        energy.double(), lambda bits: side_bits(bits.tolist(), group, scale_bytes) <= budget
    ).tolist()


def uniform(sizes: list[tuple[int, int]], kv_bytes: int, group: int = tc.GROUP) -> tc.TransformCode:
    """The floor every allocation must beat: each layer's side (latent, rope key) at one rate, as
    many bits as the side's even share of kv_bytes holds (the groups' Hadamard turn spreads each
    side's energy over its values, as a rotated uniform code of the K/V cache does)."""
    budgets = side_budgets(sizes, kv_bytes)
    lat = tuple(tuple(uniform_side(r, bl, group)) for (r, _), (bl, _) in zip(sizes, budgets))
    rope = tuple(tuple(uniform_side(dr, br, group)) for (_, dr), (_, br) in zip(sizes, budgets))
    return tc.TransformCode(lat, rope, group)


def allocate_sides(
    energies: list[tuple[torch.Tensor, torch.Tensor]], kv_bytes: int, group: int = tc.GROUP
) -> tc.TransformCode:
    """Each side within the uniform code's budget (side_budgets), its bits water-filled on its own
    energies — or the uniform code's where those model a smaller error — so no side gets fewer
    bits in all than the floor gives it, and no side is dropped where the floor codes it."""
    sizes = [(len(lat), len(rope)) for lat, rope in energies]
    floor = uniform(sizes, kv_bytes, group)
    sides = []
    for (lat, rope), (bl, br), fl, fr in zip(
        energies, side_budgets(sizes, kv_bytes), floor.latent_bits, floor.rope_bits
    ):
        pair = []
        for energy, budget, flat_floor in ((lat, bl, fl), (rope, br, fr)):
            filled = waterfill_side(energy, budget, group)
            better = tc.expected_error(energy, filled) <= tc.expected_error(energy, list(flat_floor))
            pair.append(tuple(filled if better and any(filled) else flat_floor))
        sides.append(pair)
    return tc.TransformCode(tuple(p[0] for p in sides), tuple(p[1] for p in sides), group)


ALLOCATIONS = {"uniform": None, "sides": allocate_sides, "global": allocate}  # uniform: sizes only


def allocation(name: str, energies, kv_bytes: int) -> tc.TransformCode:
    """The code `name` (one of ALLOCATIONS) gives these energies within kv_bytes."""
    if name == "uniform":
        return uniform([(len(lat), len(rope)) for lat, rope in energies], kv_bytes)
    return ALLOCATIONS[name](energies, kv_bytes)


def model_energies(
    cfg: dict, tensors: dict, stats: list[LayerStats], k_weight: float, rope_scale: float = 1.0, centred: bool = False
):
    """layer_energies of every layer; rope_scale multiplies the rope key's (a K / latent balance to try)."""
    out = []
    for i, st in enumerate(stats):
        lat, rope = layer_energies(cfg, tensors, i, st, k_weight, centred)
        out.append((lat, rope * rope_scale))
    return out
