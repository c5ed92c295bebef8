"""Build one MLA layer's weights from a source layer, its RoPE plan and its latent.

Layouts (per head h of group g = h // G, P = d/2 frequencies, S = dr/2 rope slots):
- q_proj rows per head: [nope (dn) ; rope (dr)], all times √((dn+dr)/d) so the MLA
  softmax scale 1/√(dn+dr) equals the source's 1/√d;
- nope dims: [Re of the F nope frequencies, zero pad ; Im of them, zero pad] (dn = 2·F_max);
- rope dims interleaved, slot s = dims (2s, 2s+1) = (Re, Im), as DeepSeek lays them out;
- kv_a_proj_with_mqa rows: [latent (r) ; rope key (dr)]; kv_b_proj rows per head: [k_nope (dn) ; v (d)].
"""

from __future__ import annotations

import torch

from latentkv.convert.rope_plan import RopePlan


def mixed_keys(plan: RopePlan, wk: torch.Tensor, num_kv: int) -> torch.Tensor:
    """k'_{c,j} weights [Hkv(c), 2(re/im), P, D+1] from augmented key weights [Hkv*d, D+1]."""
    w = wk.view(num_kv, 2, -1, wk.shape[1])
    return torch.einsum("jcg,gpjx->cpjx", plan.mix, w)


def dropped_pairs(plan: RopePlan) -> torch.Tensor:
    """[n, 2] (component, frequency) of the pairs that lost RoPE, in a fixed order."""
    return plan.dropped.nonzero()


def key_features(plan: RopePlan, wk: torch.Tensor, num_kv: int) -> torch.Tensor:
    """f_K weights [2n, D+1]: the dropped k' pairs, (Re, Im) consecutive."""
    kp = mixed_keys(plan, wk, num_kv)
    pairs = dropped_pairs(plan)
    return kp[pairs[:, 0], :, pairs[:, 1], :].reshape(-1, wk.shape[1])


def key_maps(plan: RopePlan, num_kv: int, dn: int) -> torch.Tensor:
    """B_g [Hkv, dn, 2n]: group g's nope key (nope layout) from the features f_K."""
    pairs = dropped_pairs(plan)
    freqs = plan.nope_freqs.tolist()
    slot = {j: m for m, j in enumerate(freqs)}
    half = dn // 2
    maps = torch.zeros(num_kv, dn, 2 * len(pairs), dtype=torch.float64)
    for n, (c, j) in enumerate(pairs.tolist()):
        m = slot[j]
        maps[:, m, 2 * n] = plan.unmix[j, :, c]
        maps[:, half + m, 2 * n + 1] = plan.unmix[j, :, c]
    return maps


def complex_rows(wre: torch.Tensor, wim: torch.Tensor, z: torch.Tensor):
    """Rows of z·(q_re + i q_im): (Re rows, Im rows); z broadcasts against the rows' leading dims."""
    a, b = z.real[..., None], z.imag[..., None]
    return a * wre - b * wim, b * wre + a * wim


def nope_queries(plan: RopePlan, wq: torch.Tensor, num_heads: int, dn: int) -> torch.Tensor:
    """[H, dn, D+1]: each head's nope query φ_{h,j} q_{h,j} at the nope frequencies (unscaled)."""
    w = wq.view(num_heads, 2, -1, wq.shape[1])
    freqs = plan.nope_freqs
    re, im = complex_rows(w[:, 0, freqs], w[:, 1, freqs], plan.nope_phase[:, freqs])
    out = torch.zeros(num_heads, dn, wq.shape[1], dtype=torch.float64)
    out[:, : len(freqs)] = re
    out[:, dn // 2 : dn // 2 + len(freqs)] = im
    return out


def rope_queries(plan: RopePlan, wq: torch.Tensor, num_heads: int, group: int) -> torch.Tensor:
    """[H, dr, D+1]: rope query of each slot, A⁻¹_j[g,c]·ψ_{h,s}·q_{h,j}, interleaved (unscaled)."""
    w = wq.view(num_heads, 2, -1, wq.shape[1])
    S = plan.kept.shape[0]
    out = torch.zeros(num_heads, S, 2, wq.shape[1], dtype=torch.float64)
    g = torch.arange(num_heads) // group
    for s, (c, j) in enumerate(plan.kept.tolist()):
        if c < 0:
            continue
        z = plan.unmix[j, g, c] * plan.rope_phase[:, s]
        out[:, s, 0], out[:, s, 1] = complex_rows(w[:, 0, j], w[:, 1, j], z)
    return out.view(num_heads, 2 * S, wq.shape[1])


def rope_keys(plan: RopePlan, wk: torch.Tensor, num_kv: int) -> torch.Tensor:
    """[dr, D+1]: the kept k' pairs, interleaved (Re, Im) per slot; empty slots are zero."""
    kp = mixed_keys(plan, wk, num_kv)
    S = plan.kept.shape[0]
    out = torch.zeros(S, 2, wk.shape[1], dtype=torch.float64)
    for s, (c, j) in enumerate(plan.kept.tolist()):
        if c >= 0:
            out[s] = kp[c, :, j]
    return out.view(2 * S, wk.shape[1])


def build_layer(plan, fact, wq, wk, wv, wo, num_heads, num_kv, dn, scale) -> dict[str, torch.Tensor]:
    """MLA attention tensors (float64; biases as the last column of the *_aug entries).

    wq [H*d, D+1], wk / wv [Hkv*d, D+1] augmented; wo [D, H*d]; fact: the latent of
    Z = [f_K; V]; scale = √((dn+dr)/d). Returns q_aug [H*(dn+dr), D+1], kv_a_aug [r+dr, D+1],
    kv_b [H*(dn+d), r], o [D, H*d].
    """
    group = num_heads // num_kv
    d = wv.shape[0] // num_kv
    n_k = 2 * len(dropped_pairs(plan))
    q = torch.cat([nope_queries(plan, wq, num_heads, dn), rope_queries(plan, wq, num_heads, group)], 1) * scale
    kv_a = torch.cat([fact.latent, rope_keys(plan, wk, num_kv)], 0)
    maps = key_maps(plan, num_kv, dn)
    rk, rv = fact.recon[:n_k], fact.recon[n_k:]
    heads = []
    for h in range(num_heads):
        g = h // group
        heads += [maps[g] @ rk, rv[g * d : (g + 1) * d]]
    return {"q_aug": q.reshape(-1, wq.shape[1]), "kv_a_aug": kv_a, "kv_b": torch.cat(heads, 0), "o": wo.double()}
