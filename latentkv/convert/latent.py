"""The latent: a weighted low-rank factorization of the no-RoPE keys and the values.

Z = [f_K; V] = W_Z x̃ stacks the key components that lost RoPE (features f_K, shared
by all heads) and every KV head's value. With a PSD weight M on Z's error, the best
rank-r map is c = U_rᵀ M^½ Z, Z ≈ M^-½ U_r c, U_r the top eigenvectors of
M^½ E[ZZᵀ] M^½ (PCA in the weighted space). M is either
- "balanced": K features scaled by 1/α so that their energy equals V's, or
- "aware": K error weighted by the second moment of the queries that read it (so the
  error is measured in attention scores), V error by Wo_hᵀWo_h of the heads that read
  it (error in attention output), the two balanced by their total weighted energy.
At full rank the factorization is exact for any M.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

RIDGE = 1e-7


@dataclass
class Factorization:
    """latent [r, D+1] (c = latent @ x̃), recon [n_z, r] (Z ≈ recon @ c), spectrum [n_z] (weighted, descending)."""

    latent: torch.Tensor
    recon: torch.Tensor
    spectrum: torch.Tensor


def sym_powers(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M^½, M^-½) of a symmetric PSD matrix, with a small relative ridge."""
    lam, U = torch.linalg.eigh((m + m.T) / 2)
    lam = lam.clamp(min=0) + RIDGE * lam.clamp(min=0).mean() + 1e-30
    return (U * lam.sqrt()) @ U.T, (U / lam.sqrt()) @ U.T


def balanced_weight(wz: torch.Tensor, xx: torch.Tensor, n_k: int) -> torch.Tensor:
    """M = diag(1/α² on the n_k key features, 1 on V), α² = E|f_K|² / E|V|²."""
    energy = ((wz @ xx) * wz).sum(1)
    alpha2 = energy[:n_k].sum() / energy[n_k:].sum().clamp(min=1e-30) if n_k else torch.tensor(1.0)
    diag = torch.ones(wz.shape[0], dtype=torch.float64)
    diag[:n_k] = 1 / alpha2.clamp(min=1e-30)
    return torch.diag(diag)


def aware_weight(wz, xx, n_k, key_maps, nope_queries, wo_blocks, group) -> torch.Tensor:
    """M = blockdiag(Σ_h B_gᵀ E[q_h q_hᵀ] B_g, β·blockdiag_g Σ_{h∈g} Wo_hᵀ Wo_h).

    key_maps [Hkv, dn, n_k]: B_g (nope key of group g from the features);
    nope_queries [H, dn, D+1]: each head's nope query rows; wo_blocks [H, D, dv].
    β makes the weighted K and V energies equal.
    """
    H = nope_queries.shape[0]
    mk = torch.zeros(n_k, n_k, dtype=torch.float64)
    for h in range(H):
        qq = nope_queries[h] @ xx @ nope_queries[h].T
        b = key_maps[h // group]
        mk += b.T @ qq @ b
    nv = wz.shape[0] - n_k
    dv = wo_blocks.shape[2]
    mv = torch.zeros(nv, nv, dtype=torch.float64)
    for h in range(H):
        g = h // group
        mv[g * dv:(g + 1) * dv, g * dv:(g + 1) * dv] += wo_blocks[h].T @ wo_blocks[h]
    cz = wz @ xx @ wz.T
    ek = (mk * cz[:n_k, :n_k]).sum() if n_k else torch.tensor(0.0, dtype=torch.float64)
    ev = (mv * cz[n_k:, n_k:]).sum()
    beta = ek / ev if n_k and ek > 0 else torch.tensor(1.0, dtype=torch.float64)
    m = torch.zeros(wz.shape[0], wz.shape[0], dtype=torch.float64)
    m[:n_k, :n_k] = mk
    m[n_k:, n_k:] = beta * mv
    return m


def attention_weight(n_k, key_maps, nope_queries, xx, wo_blocks, group, rho, kappa, head_dim) -> torch.Tensor:
    """M in attention-output units: K error of head h weighted by κ_h·E[q qᵀ]/d (a score error's
    reach, softmax scale 1/√d), V error by ρ_h·Wo_hᵀWo_h (a value error's reach). No free balance.

    key_maps [Hkv, dn, n_k]; nope_queries [H, dn, D+1]; wo_blocks [H, D, dv]; rho, kappa [H].
    """
    H, _, dv = wo_blocks.shape
    Hkv = key_maps.shape[0]
    m = torch.zeros(n_k + Hkv * dv, n_k + Hkv * dv, dtype=torch.float64)
    for h in range(H):
        g = h // group
        if n_k:
            qq = nope_queries[h] @ xx @ nope_queries[h].T
            m[:n_k, :n_k] += (kappa[h] / head_dim) * key_maps[g].T @ qq @ key_maps[g]
        m[n_k + g * dv:n_k + (g + 1) * dv, n_k + g * dv:n_k + (g + 1) * dv] += rho[h] * wo_blocks[h].T @ wo_blocks[h]
    return m


def factorize(wz: torch.Tensor, xx: torch.Tensor, weight: torch.Tensor, rank: int) -> Factorization:
    """Rank-`rank` weighted PCA of Z = wz x̃ (wz [n_z, D+1], xx = E[x̃x̃ᵀ], weight M [n_z, n_z])."""
    half, inv_half = sym_powers(weight)
    cz = wz @ xx @ wz.T
    lam, U = torch.linalg.eigh(half @ cz @ half)
    lam, U = lam.flip(0).clamp(min=0), U.flip(1)
    u = U[:, :rank]
    return Factorization(latent=u.T @ half @ wz, recon=inv_half @ u, spectrum=lam)


def rotate(fact: Factorization, seed: int = 0) -> Factorization:
    """Mix the latent by a fixed random orthogonal Q (c' = Q c, recon' = recon Qᵀ).

    Exact in float arithmetic; it spreads the PCA's energy evenly over the latent dims, so a
    per-token int8 scale (max|c|/127) is set by a typical dim rather than the top component.
    RMSNorm (the stock kv_a_layernorm, unit weight) is invariant to it.
    """
    r = fact.latent.shape[0]
    q, _ = torch.linalg.qr(torch.randn(r, r, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return Factorization(q @ fact.latent, fact.recon @ q.T, fact.spectrum)


def pad(fact: Factorization, width: int) -> Factorization:
    """The latent widened to `width` with zero dims (zero rows of latent, zero columns of recon): exact.

    The stock kv_a_layernorm's mean square is then over `width` dims; linearize_norm scales by the
    padded RMS, so each token's normalized latent is the same as unpadded.
    """
    r = fact.latent.shape[0]
    if width <= r:
        return fact
    latent = torch.cat([fact.latent, fact.latent.new_zeros(width - r, fact.latent.shape[1])], 0)
    recon = torch.cat([fact.recon, fact.recon.new_zeros(fact.recon.shape[0], width - r)], 1)
    return Factorization(latent, recon, fact.spectrum)


def allocate_ranks(spectra: list[torch.Tensor], total: int, min_rank: int = 1, scales=None) -> list[int]:
    """Per-layer ranks summing to `total`, keeping the globally largest (scaled) eigenvalues.

    Each spectrum is multiplied by its layer's scale (e.g. 1/E|h|², turning output error
    into relative error of the residual stream), or, without scales, normalised by its sum.
    """
    L = len(spectra)
    ranks = [min(min_rank, len(s)) for s in spectra]
    pool = []
    for layer, s in enumerate(spectra):
        rel = s * scales[layer] if scales is not None else s / s.sum().clamp(min=1e-30)
        pool += [(float(v), layer) for v in rel[ranks[layer]:]]
    pool.sort(key=lambda t: -t[0])
    for _, layer in pool[: max(0, total - sum(ranks))]:
        ranks[layer] += 1
    assert len(ranks) == L
    return ranks
