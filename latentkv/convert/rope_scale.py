"""Balance each rope pair's key and query sizes, so that an 8-bit rope key loses little.

The rope key's pairs differ in size by orders of magnitude (each is a principal component of the
keys at one frequency, rope_plan.py), and an 8-bit cache stores a token's rope key as int8 codes
with one scale (max|k_r| / 127, facts.ROPE8): the small pairs would fall below one code step,
however much their queries weigh them. RoPE turns each pair (dims 2s, 2s+1) in its own plane, so
scaling a pair's key rows by a_s and every head's query rows of that pair by 1/a_s leaves every
score unchanged, in any cache dtype. As SmoothQuant balances activations against weights, a_s
makes each pair's key rms proportional to sqrt(rms_k · rms_q) (ALPHA = 1/2; the query's rms over
all heads), both measured under the calibration statistics, with the pairs' geometric mean kept.
Measured (chat top-1 agreement with the source, int8 latent and int8 rope key, SmolLM2): the exact
conversion 0.977 with equal key energy per pair (ALPHA 0), 0.984 at 1/4, 0.986 at 1/2, lower at
3/4 and 1, on calibration chat prompts; docs/conversion.md, "The frontier".
"""

from __future__ import annotations

import torch

ALPHA = 0.5


def pair_energy(rows: torch.Tensor, xx: torch.Tensor) -> torch.Tensor:
    """rows [..., dr, D+1] of an augmented projection -> E[y²] summed per rope pair (and over any
    leading dims) [dr/2], under xx = E[x̃x̃ᵀ]."""
    rows = rows.reshape(-1, *rows.shape[-2:])
    energy = torch.einsum("nid,de,nie->i", rows, xx.to(rows.dtype), rows).clamp_min(0)
    return energy.view(-1, 2).sum(1)


def equalize_rope_pairs(w: dict[str, torch.Tensor], xx: torch.Tensor, num_heads: int) -> dict[str, torch.Tensor]:
    """A layer's tensors (assemble.build_layer's: q_aug [H*(dn+dr), D+1], kv_a_aug [r+dr, D+1], ...)
    with each rope pair's key rows scaled by a_s and its query rows by 1/a_s (scores unchanged)."""
    r = w["kv_b"].shape[1]
    dr = w["kv_a_aug"].shape[0] - r
    if dr == 0:
        return w
    q = w["q_aug"].view(num_heads, -1, w["q_aug"].shape[1])
    key_e, query_e = pair_energy(w["kv_a_aug"][r:], xx), pair_energy(q[:, -dr:], xx)
    live = (key_e > key_e.max() * 1e-12) & (query_e > query_e.max() * 1e-12)  # empty slots stay as they are
    if not live.any():
        return w
    # a_s ∝ sqrt(rms_q / rms_k) at ALPHA 1/2: the key's rms becomes ∝ rms_k^(1-α) rms_q^α
    log_a = torch.zeros_like(key_e)
    log_a[live] = 0.5 * (ALPHA * query_e[live].log() - ALPHA * key_e[live].log())
    log_a[live] -= log_a[live].mean()  # the keys' geometric mean rms kept
    a = log_a.exp().repeat_interleave(2)  # [dr]: both dims of a pair
    q = q.clone()
    q[:, -dr:] /= a[:, None]
    kv_a = w["kv_a_aug"].clone()
    kv_a[r:] *= a[:, None]
    return {**w, "q_aug": q.view_as(w["q_aug"]), "kv_a_aug": kv_a}
