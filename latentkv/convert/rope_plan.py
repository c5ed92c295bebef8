"""RoPE handling: which rotated key components keep RoPE, and at what frequency.

Pair j of a head (dims j and j + d/2, angle θ_j per token) is the complex number
k_j = k[j] + i·k[j+d/2]. At one frequency RoPE multiplies every KV head's k_j by the
same e^{iθ_j n}, so a real mixing A_j across KV heads commutes with it:
k'_{c,j} = Σ_g A_j[c,g] k_{g,j} and head h (group g) scores Σ_c A_j⁻¹[g,c] q_{h,j} k'*_{c,j}.

A_j is the PCA of the keys weighted by each group's query energy at j, so component
c's eigenvalue λ_{c,j} is its share of the expected score energy. Keeping a pair
(c, j) as a rope dim costs cache; dropping it makes its score term lose the factor
e^{iθ_jΔ}, which we replace by its attention-weighted mean φ_{h,j} = E_h[e^{iθ_jΔ}]
(folded into the query, per head). The residual error is λ·(1 - |φ|²) in expectation,
so the kept pairs are those with the largest λ·(1 - |φ|²).

Which distances: calibration windows are long (512 tokens) and queries deep in them attend to
far tokens too (attention sinks among them), so over all distances the mean phase of the mid
frequencies largely cancels (|φ| ≈ 0.3 - 0.6) — while in a chat prompt of 50 - 200 tokens those
pairs turn by a small angle (|φ| ≈ 0.8 - 0.99). The φ folded into the query is therefore taken over the
distances below a window (`near`; ConvertOptions.rope_window); the ranking stays over every distance, so the
pairs long contexts need keep RoPE (measured: docs/conversion.md, "The phase window").

For the stock format the rope dims must rotate at DeepSeek's schedule
f_s = θ^(-2s/dr); a pair put in slot s keeps e^{i f_s Δ} and folds
ψ = E[e^{i(θ_j - f_s)Δ}] into its query. Pairs are assigned to slots greedily by gain.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EPS = 1e-8


@dataclass
class RopePlan:
    """One layer's RoPE decision (Hkv KV heads, d/2 = P frequencies, S = dr/2 slots).

    mix [P, Hkv, Hkv]: A_j (k' = A k); unmix [P, Hkv, Hkv]: A_j⁻¹;
    kept [S, 2] long: (component, frequency) of each rope slot; slot_freq [S]: its angle per token;
    rope_phase [H, S] complex: ψ folded into each head's rope query;
    nope_phase [H, P] complex: φ folded into each head's nope query;
    dropped [Hkv, P] bool: components that lost RoPE; energy [Hkv, P]: λ.
    """

    mix: torch.Tensor
    unmix: torch.Tensor
    kept: torch.Tensor
    slot_freq: torch.Tensor
    rope_phase: torch.Tensor
    nope_phase: torch.Tensor
    dropped: torch.Tensor
    energy: torch.Tensor

    @property
    def nope_freqs(self) -> torch.Tensor:
        """[F] frequencies with at least one dropped component (the nope dims come in pairs)."""
        return self.dropped.any(0).nonzero().flatten()


def augment(w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """[out, D] weight and optional bias -> [out, D+1] acting on x̃ = [x; 1] (float64)."""
    bias = torch.zeros(w.shape[0], dtype=torch.float64) if b is None else b.double()
    return torch.cat([w.double(), bias[:, None]], dim=1)


def query_energy(wq: torch.Tensor, xx: torch.Tensor, num_heads: int) -> torch.Tensor:
    """E|q_{h,j}|² [H, P] from augmented query weights [H*d, D+1] and E[x̃x̃ᵀ]."""
    e = ((wq @ xx) * wq).sum(1).view(num_heads, 2, -1)
    return e.sum(1)


def key_covariance(wk: torch.Tensor, xx: torch.Tensor, num_kv: int) -> torch.Tensor:
    """E[Re(k_{g,j} k*_{g',j})] [P, Hkv, Hkv] from augmented key weights [Hkv*d, D+1]."""
    w = wk.view(num_kv, 2, -1, wk.shape[1])
    wx = (wk @ xx).view(num_kv, 2, -1, wk.shape[1])
    return torch.einsum("gpjx,hpjx->jgh", wx, w)


def weighted_pca(kcov: torch.Tensor, weight: torch.Tensor):
    """Per-frequency PCA of S k with S = diag(√weight): (A, A⁻¹, λ) with λ [Hkv, P] descending.

    kcov [P, Hkv, Hkv]; weight [Hkv, P]. A_j[c, g] = U[g, c]·√w_g, A_j⁻¹[g, c] = U[g, c]/√w_g.
    """
    w = weight.T + EPS * weight.mean()  # [P, Hkv]
    s = w.sqrt()
    lam, U = torch.linalg.eigh(s[:, :, None] * kcov * s[:, None, :])
    lam, U = lam.flip(-1).clamp(min=0), U.flip(-1)
    mix = U.transpose(1, 2) * s[:, None, :]
    unmix = U / s[:, :, None]
    return mix, unmix, lam.T.contiguous()


def near(dist: torch.Tensor, window: int | None) -> torch.Tensor:
    """dist [H, T] with the attention mass at distances Δ >= window removed (None: every distance)."""
    if window is None or window >= dist.shape[1]:
        return dist
    out = dist.clone()
    out[:, window:] = 0
    return out


def phase_means(dist: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """E_h[e^{i f Δ}] [H, len(freqs)] under each head's attention distances dist [H, T]."""
    p = dist / dist.sum(1, keepdim=True).clamp(min=EPS)
    delta = torch.arange(dist.shape[1], dtype=torch.float64)
    angles = delta[:, None] * freqs.double()[None, :]
    return torch.complex(p @ angles.cos(), p @ angles.sin())


def head_energy(unmix: torch.Tensor, lam: torch.Tensor, qe: torch.Tensor, group: int) -> torch.Tensor:
    """e[h, c, j]: head h's expected score energy through pair (c, j); sums over h to λ."""
    w = qe.view(-1, group, qe.shape[1])  # [Hkv, G, P]
    share = qe / w.sum(1).repeat_interleave(group, 0).clamp(min=EPS)  # [H, P]
    u2 = (unmix**2).permute(1, 2, 0) * w.sum(1)[:, None, :]  # [g, c, j]: A⁻¹[g,c]²·w_g = U[g,c]²
    u2 = u2.repeat_interleave(group, 0)  # [H, c, j]
    return u2 * share[:, None, :] * lam[None]


def assign_slots(gain: torch.Tensor, slots: int) -> torch.Tensor:
    """Greedy assignment of pairs to slots by gain [pairs, slots]: slot -> pair index (-1: empty)."""
    owner = torch.full((slots,), -1, dtype=torch.long)
    used = torch.zeros(gain.shape[0], dtype=torch.bool)
    flat = gain.flatten().argsort(descending=True)
    for idx in flat.tolist():
        pair, slot = divmod(idx, slots)
        if owner[slot] < 0 and not used[pair] and gain[pair, slot] > 0:
            owner[slot], used[pair] = pair, True
            if (owner >= 0).all():
                break
    return owner


def plan_layer(wq, wk, xx, dist, inv_freq, num_heads, num_kv, rope_dim, slot_freq=None, window=None) -> RopePlan:
    """Decide one layer's RoPE. wq [H*d, D+1], wk [Hkv*d, D+1] augmented; rope_dim = 2·slots.

    slot_freq None: native (each kept pair rotates at its own θ_j, chosen by λ(1-|φ|²) with φ over
    every distance of dist; the dropped pairs fold φ over the distances below window);
    else the stock schedule [S] and pairs are assigned to its slots (window not used).
    """
    group = num_heads // num_kv
    P = inv_freq.shape[0]
    qe = query_energy(wq, xx, num_heads)
    weight = qe.view(num_kv, group, P).sum(1)
    mix, unmix, lam = weighted_pca(key_covariance(wk, xx, num_kv), weight)
    e = head_energy(unmix, lam, qe, group)  # [H, Hkv, P]
    phi = phase_means(dist, inv_freq)  # [H, P]
    S = rope_dim // 2
    drop_cost = (e * (1 - phi.abs() ** 2)[:, None, :]).sum(0)  # [Hkv, P]
    if slot_freq is None:
        phi = phase_means(near(dist, window), inv_freq)  # what a dropped pair folds: short contexts' phase
        order = drop_cost.flatten().argsort(descending=True)[:S]
        kept = torch.stack([order // P, order % P], 1)
        kept = kept[torch.argsort(inv_freq[kept[:, 1]], descending=True, stable=True)]
        slot_freq = inv_freq[kept[:, 1]].double()
        rope_phase = torch.ones(num_heads, S, dtype=torch.complex128)
    else:
        kept, rope_phase = assign_stock(e, phi, dist, inv_freq, slot_freq)
    dropped = torch.ones(num_kv, P, dtype=torch.bool)
    valid = kept[:, 0] >= 0
    dropped[kept[valid, 0], kept[valid, 1]] = False
    return RopePlan(mix, unmix, kept, slot_freq.double(), rope_phase, phi, dropped, lam)


def assign_stock(e, phi, dist, inv_freq, slot_freq):
    """Assign (component, frequency) pairs to stock slots: (kept [S, 2], ψ [H, S]).

    Gain of pair (c, j) in slot s: Σ_h e[h,c,j]·(|ψ_{h,j,s}|² − |φ_{h,j}|²). Empty slots
    get kept = (-1, -1) and a zero rope key.
    """
    H, C, P = e.shape
    S = slot_freq.shape[0]
    delta = (inv_freq.double()[:, None] - slot_freq.double()[None, :]).flatten()  # [P*S]
    psi = phase_means(dist, delta).view(H, P, S)
    gain = torch.einsum("hcj,hjs->cjs", e, psi.abs() ** 2 - (phi.abs() ** 2)[:, :, None]).reshape(C * P, S)
    owner = assign_slots(gain, S)
    kept = torch.stack([torch.where(owner >= 0, owner // P, -1), torch.where(owner >= 0, owner % P, -1)], 1)
    rope_phase = torch.zeros(H, S, dtype=torch.complex128)
    for s in range(S):
        if owner[s] >= 0:
            rope_phase[:, s] = psi[:, kept[s, 1], s]
    return kept, rope_phase


def stock_gain(e, phi, dist, inv_freq, slot_freq) -> float:
    """Total expected score energy the stock slots keep (to choose rope_theta)."""
    kept, psi = assign_stock(e, phi, dist, inv_freq, slot_freq)
    total = 0.0
    for s in range(kept.shape[0]):
        c, j = kept[s].tolist()
        if c >= 0:
            total += float((e[:, c, j] * (psi[:, s].abs() ** 2 - phi[:, j].abs() ** 2)).sum())
    return total
