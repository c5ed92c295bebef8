"""The latent: a weighted low-rank factorization of the no-RoPE keys and the values.

Z = [f_K; V] = W_Z x̃ stacks the key components that lost RoPE (features f_K, shared
by all heads) and every KV head's value. With a PSD weight M on Z's error, the best
rank-r map is c = U_rᵀ M^½ Z, Z ≈ M^-½ U_r c, U_r the top eigenvectors of
M^½ E[ZZᵀ] M^½ (PCA in the weighted space). M puts both errors in attention-output
units (attention_weight). At full rank the factorization is exact for any M.
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
        m[n_k + g * dv : n_k + (g + 1) * dv, n_k + g * dv : n_k + (g + 1) * dv] += (
            rho[h] * wo_blocks[h].T @ wo_blocks[h]
        )
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
