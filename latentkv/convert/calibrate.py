"""Calibration statistics, accumulated layer by layer, never storing activations.

For each layer we keep the second moment of the attention input (augmented with a
constant 1 so biases are exact), the attention mass by query-key distance of each
head (for RoPE's phase statistics) and how strongly value and score errors reach
each head's output. Everything
the converter needs (key / query / value moments) is derived from these.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from latentkv.convert import reference as ref
from latentkv.convert.source_model import SourceModel
from latentkv.model.norm import rms_norm


@dataclass
class LayerStats:
    """One layer's calibration statistics.

    xx [D+1, D+1] float64: E[x̃ x̃ᵀ] of the normed attention input x̃ = [x; 1];
    dist [H, T] float64: attention probability mass at distance Δ = 0..T-1, per head;
    rho [H]: E_m[Σ_n p_mn²], how much one value error reaches a head's output;
    kappa [H]: E_m[Σ_n p_mn² |Wo_h(v_n − o_m)|²], how much one score error moves it;
    tokens: count.
    """

    xx: torch.Tensor
    dist: torch.Tensor
    rho: torch.Tensor
    kappa: torch.Tensor
    tokens: int


def add_moments(xx: torch.Tensor, x: torch.Tensor) -> None:
    """xx += x̃ᵀ x̃ for x [N, D] (float64 accumulation)."""
    xa = torch.cat([x.float(), torch.ones(x.shape[0], 1, dtype=torch.float32, device=x.device)], dim=1)
    xx += (xa.T @ xa).double()  # float32 product per batch (fast), float64 running sum


def add_distances(dist: torch.Tensor, probs: torch.Tensor) -> None:
    """dist [H, T] += attention mass of probs [B, H, T, T] at each distance m - n."""
    B, H, T, _ = probs.shape
    m = torch.arange(T, device=probs.device)
    delta = (m[:, None] - m[None, :]).clamp(min=0).reshape(-1)  # masked (n > m) entries carry 0 mass
    mass = probs.float().sum(0).reshape(H, T * T)
    dist += torch.zeros(H, T, dtype=torch.float32, device=probs.device).index_add_(1, delta, mass).double()


def add_sensitivity(rho: torch.Tensor, kappa: torch.Tensor, probs: torch.Tensor, v: torch.Tensor, wo: torch.Tensor) -> None:
    """Accumulate Σ_m Σ_n p_mn² (rho) and Σ_m Σ_n p_mn² |Wo_h(v_n − o_m)|² (kappa), per head.

    A score error δs_n moves a head's output by Σ_n p_n δs_n (v_n − o); independent errors
    of equal size give the kappa factor, value errors the rho factor (first order).
    probs [B, H, T, T]; v [B, H, T, d] (repeated to H heads); wo [D, H*d].
    """
    B, H, T, d = v.shape
    u = torch.einsum("bhtd,ehd->bhte", v, wo.view(-1, H, d))  # Wo_h v_n [B, H, T, D]
    o = probs @ u  # Wo_h o_m
    p2 = probs.square()
    u2 = u.square().sum(-1)  # [B, H, T]
    term = (p2 @ u2[..., None]).squeeze(-1) - 2 * ((p2 @ u) * o).sum(-1) + p2.sum(-1) * o.square().sum(-1)
    rho += p2.sum((0, 2, 3)).double()
    kappa += term.sum((0, 2)).double()


@torch.no_grad()
def collect_stats(src: SourceModel, windows: torch.Tensor, batch: int = 4, device="cpu") -> list[LayerStats]:
    """Statistics of every layer over token windows [N, T].

    The residual stream of all windows is held (N*T*D floats); one layer's attention
    probabilities at a time.
    """
    N, T = windows.shape
    D, H = src.hidden_size, src.num_heads
    positions = torch.arange(T, device=device)
    hidden = [ref.embed(src, windows[b:b + batch].to(device)) for b in range(0, N, batch)]
    stats = []
    for i in tqdm(range(src.num_layers), desc="calibrating layers", unit="layer"):
        layer = src.layer(i)
        xx = torch.zeros(D + 1, D + 1, dtype=torch.float64, device=device)
        dist = torch.zeros(H, T, dtype=torch.float64, device=device)
        rho = torch.zeros(H, dtype=torch.float64, device=device)
        kappa = torch.zeros(H, dtype=torch.float64, device=device)
        moved = []
        for h in hidden:
            x = rms_norm(h, layer["attn_norm"], src.rms_norm_eps)
            add_moments(xx, x.reshape(-1, D))
            out, probs = ref.attention(src, layer, x, positions, return_probs=True)
            add_distances(dist, probs)
            v = ref.project_qkv(src, layer, x)[2].repeat_interleave(H // src.num_kv_heads, dim=1)
            add_sensitivity(rho, kappa, probs, v, layer["o"])
            h = h + out  # the source layer's forward, reusing this attention output
            moved.append(h + ref.mlp(layer, rms_norm(h, layer["mlp_norm"], src.rms_norm_eps)))
        count = N * T
        stats.append(LayerStats(xx=(xx / count).cpu(), dist=dist.cpu(), rho=(rho / count).cpu(),
                                kappa=(kappa / count).cpu(), tokens=count))
        hidden = moved
    return stats


def save_stats(stats: list[LayerStats], path) -> None:
    """Write statistics as safetensors (no pickle), to reuse across sweeps."""
    from safetensors.torch import save_file

    tensors = {f"{name}": torch.stack([getattr(st, name) for st in stats]) for name in ("xx", "dist", "rho", "kappa")}
    tensors["tokens"] = torch.tensor([st.tokens for st in stats])
    save_file(tensors, str(path))


def load_stats(path) -> list[LayerStats]:
    """Read statistics written by save_stats."""
    from safetensors.torch import load_file

    t = load_file(str(path))
    return [LayerStats(xx=t["xx"][i], dist=t["dist"][i], rho=t["rho"][i], kappa=t["kappa"][i],
                       tokens=int(t["tokens"][i])) for i in range(len(t["rho"]))]
