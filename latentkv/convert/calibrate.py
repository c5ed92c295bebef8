"""Calibration statistics, accumulated layer by layer, never storing activations.

For each layer we keep the second moment of the attention input (augmented with a
constant 1 so biases are exact), the attention mass by query-key distance of each
head (for RoPE's phase statistics) and how strongly value and score errors reach
each head's output. Everything
the converter needs (key / query / value moments) is derived from these.

Positions may carry weights (a per-position weight vector [N, T], e.g. corpus.chat_emphasis:
chat answers and control tokens count more): every statistic is then a weighted mean over
positions — x̃x̃ᵀ of position n, and the attention row of query m (its distance masses, its
Σ p², its κ term), counted w times. No weights is the plain mean (a weight of 1 everywhere
gives the same numbers, tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from latentkv.model.norm import rms_norm
from latentkv.rope import cos_sin, rotate
from latentkv.sources import reference as ref
from latentkv.sources.source_model import SourceModel


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


def add_moments(xx: torch.Tensor, x: torch.Tensor, w: torch.Tensor | None = None) -> None:
    """xx += x̃ᵀ diag(w) x̃ for x [N, D], position weights w [N] (None: all 1) (float64 accumulation)."""
    xa = torch.cat([x.float(), torch.ones(x.shape[0], 1, dtype=torch.float32, device=x.device)], dim=1)
    xw = xa if w is None else xa * w[:, None]
    xx += (xw.T @ xa).double()  # float32 product per batch (fast), float64 running sum


def distance_index(T: int, device) -> torch.Tensor:
    """[T*T] query–key distance m − n of each (m, n) entry, 0 where masked (n > m carries no mass)."""
    m = torch.arange(T, device=device)
    return (m[:, None] - m[None, :]).clamp(min=0).reshape(-1)


def add_distances(dist: torch.Tensor, probs: torch.Tensor, delta: torch.Tensor, w: torch.Tensor | None = None) -> None:
    """dist [H, T] += attention mass of probs [B, H, T, T] at each distance (delta: distance_index),
    query row m counted w[b, m] times (w [B, T]; None: once)."""
    H, T = dist.shape
    mass = (probs if w is None else probs * w[:, None, :, None]).sum(0).reshape(H, T * T)
    dist += torch.zeros(H, T, dtype=probs.dtype, device=probs.device).index_add_(1, delta, mass).double()


def grouped(probs: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """probs [B, H, T, T] @ v [B, Hkv, T, d] -> [B, H, T, d] without repeating v to H heads."""
    B, H, T, _ = probs.shape
    Hkv = v.shape[1]
    return (probs.reshape(B, Hkv, (H // Hkv) * T, T) @ v).view(B, H, T, -1)


def add_sensitivity(
    rho: torch.Tensor,
    kappa: torch.Tensor,
    probs: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    gram: torch.Tensor,
    w: torch.Tensor | None = None,
) -> None:
    """Accumulate Σ_m Σ_n p_mn² (rho) and Σ_m Σ_n p_mn² |Wo_h(v_n − o_m)|² (kappa), per head.

    A score error δs_n moves a head's output by Σ_n p_n δs_n (v_n − o); independent errors
    of equal size give the kappa factor, value errors the rho factor (first order).
    |Wo_h x|² = xᵀ G_h x with G_h = Wo_hᵀ Wo_h, so everything stays in head space (d, not D).
    probs [B, H, T, T]; v [B, Hkv, T, d]; o = probs @ v [B, H, T, d]; gram G [H, d, d];
    w [B, T]: query m's weight (None: 1).
    """
    B, H, T, d = o.shape
    Hkv = v.shape[1]
    vg = v.unsqueeze(2) @ gram.view(Hkv, H // Hkv, d, d)  # [B, Hkv, G, T, d]: G_h v_n
    vgv = (vg * v.unsqueeze(2)).sum(-1).view(B, H, T)  # v_nᵀ G_h v_n
    og = o @ gram  # G_h o_m
    p2 = probs.square()
    p2sum = p2.sum(-1)
    term = (p2 @ vgv[..., None]).squeeze(-1) - 2 * (grouped(p2, v) * og).sum(-1) + p2sum * (og * o).sum(-1)
    if w is not None:
        p2sum, term = p2sum * w[:, None, :], term * w[:, None, :]
    rho += p2sum.sum((0, 2)).double()
    kappa += term.sum((0, 2)).double()


def layer_stats(
    src: SourceModel,
    layer: dict,
    hidden: list[torch.Tensor],
    positions: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    moved=None,
    weights: list | None = None,
) -> tuple[LayerStats, list]:
    """One layer's statistics over the residual-stream batches `hidden` [B, T, D] (float32), and
    the batches moved past the layer (the source's forward, reusing the attention computed here),
    appended to `moved` (default a new list; spill.DiskBatches keeps them on disk). `hidden` is
    iterated once. weights: position weights [B, T] per batch (None: unweighted).

    dtype: the projections' and MLP's matmuls (bfloat16 halves their time on CPUs with native
    bf16); the residual stream, norms, softmax and every statistic stay float32 or wider."""
    D, H, Hkv, d = src.hidden_size, src.num_heads, src.num_kv_heads, src.head_dim
    T = positions.shape[0]
    device = positions.device
    xx = torch.zeros(D + 1, D + 1, dtype=torch.float64, device=device)
    dist = torch.zeros(H, T, dtype=torch.float64, device=device)
    rho = torch.zeros(H, dtype=torch.float64, device=device)
    kappa = torch.zeros(H, dtype=torch.float64, device=device)
    delta = distance_index(T, device)
    wo = layer["o"]
    gram = torch.einsum("xhd,xhe->hde", wo.view(D, H, d), wo.view(D, H, d))  # G_h = Wo_hᵀ Wo_h
    cos, sin = cos_sin(positions, src.inv_freq.to(device))
    mask = torch.ones(T, T, dtype=torch.bool, device=device).triu(1)
    low = {name: w if w is None or name.endswith("norm") else w.to(dtype) for name, w in layer.items()}
    moved = [] if moved is None else moved
    count, total = 0, 0.0
    for b, h in enumerate(hidden):
        B = h.shape[0]
        w = None if weights is None else weights[b].to(device=device, dtype=torch.float32)
        count += B * T
        total += B * T if w is None else float(w.double().sum())
        x = rms_norm(h, layer["attn_norm"], src.rms_norm_eps)
        add_moments(xx, x.reshape(-1, D), None if w is None else w.reshape(-1))
        q, k, v = (t.float() for t in ref.project_qkv(src, low, x.to(dtype)))
        q, k = rotate(q, cos, sin, interleaved=False), rotate(k, cos, sin, interleaved=False)
        scores = (q.reshape(B, Hkv, (H // Hkv) * T, d) @ k.transpose(-1, -2)).view(B, H, T, T) * d**-0.5
        probs = scores.masked_fill_(mask, float("-inf")).softmax(-1)
        o = grouped(probs, v)
        add_distances(dist, probs, delta, w)
        add_sensitivity(rho, kappa, probs, v, o, gram, w)
        del scores, probs
        h = h + F.linear(o.transpose(1, 2).reshape(B, T, H * d), wo)
        moved.append(h + ref.mlp(low, rms_norm(h, layer["mlp_norm"], src.rms_norm_eps).to(dtype)).float())
    stats = LayerStats(
        xx=(xx / total).cpu(), dist=dist.cpu(), rho=(rho / total).cpu(), kappa=(kappa / total).cpu(), tokens=count
    )
    return stats, moved


@torch.no_grad()
def collect_stats(
    src: SourceModel,
    windows: torch.Tensor,
    batch: int = 4,
    device="cpu",
    dtype: torch.dtype = torch.float32,
    store=list,
    keep=None,
    weights: torch.Tensor | None = None,
) -> list[LayerStats]:
    """Statistics of every layer over token windows [N, T] (dtype: the source forward's matmuls),
    each position counted by weights [N, T] (None: unweighted; see the module docstring).

    The residual stream of all windows is held (N*T*D floats) in containers made by store()
    (a list; spill.batch_store: on disk past a budget); one layer's attention probabilities for
    one batch of windows at a time; one layer's weights at a time. keep(stats) is what each
    layer's statistics are kept as (spill.stats_keeper: on disk past a budget).
    """
    N, T = windows.shape
    positions = torch.arange(T, device=device)
    embedding = src.tensors["model.embed_tokens.weight"].to(device)  # read once (a streamed source reads per access)
    hidden = store()
    for b in range(0, N, batch):
        hidden.append(F.embedding(windows[b : b + batch].to(device), embedding))
    del embedding
    if weights is not None and weights.shape != windows.shape:
        raise ValueError(f"position weights {tuple(weights.shape)} do not match the windows {tuple(windows.shape)}")
    batches = None if weights is None else [weights[b : b + batch] for b in range(0, N, batch)]
    stats = []
    for i in tqdm(range(src.num_layers), desc="calibrating layers", unit="layer"):
        st, hidden = layer_stats(src, src.layer(i), hidden, positions, dtype, store(), batches)
        stats.append(keep(st) if keep else st)
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
    return [
        LayerStats(xx=t["xx"][i], dist=t["dist"][i], rho=t["rho"][i], kappa=t["kappa"][i], tokens=int(t["tokens"][i]))
        for i in range(len(t["rho"]))
    ]
