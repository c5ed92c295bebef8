"""Source + calibration statistics + options -> converted model (config dict, tensors).

The steps, each in its own module: RoPE plans (rope_plan.py), the latent of each layer
(latent.py), the layer weights (assemble.py), the DeepSeek-V3 config (layout.py).
Statistics are collected once (calibrate.py) so several settings can share them.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from latentkv.convert import latent as lat
from latentkv.convert import rope_plan
from latentkv.convert.assemble import build_layer, key_features, key_maps, nope_queries
from latentkv.convert.calibrate import LayerStats
from latentkv.convert.layout import deepseek_config
from latentkv.convert.options import ConvertOptions
from latentkv.convert.refine import Refiner
from latentkv.convert.rope_scale import equalize_rope_pairs
from latentkv.rope import default_inv_freq
from latentkv.sources.source_model import SourceModel

THETA_GRID = [10.0 ** (k / 4) for k in range(4, 29)]  # 10 .. 10^7, for the stock rope schedule


def augmented_weights(src: SourceModel, i: int):
    """(wq, wk, wv) [out, D+1] with biases as last column, and wo [D, H*d] (float64)."""
    layer = src.layer(i)
    return (
        rope_plan.augment(layer["q"], layer["q_bias"]),
        rope_plan.augment(layer["k"], layer["k_bias"]),
        rope_plan.augment(layer["v"], layer["v_bias"]),
        layer["o"].double(),
    )


def resolve_rope_dim(src: SourceModel, rope_dim: int | str, stock: bool) -> int:
    """The rope dim as an even int; "all" keeps every rotated component (native only)."""
    full = src.num_kv_heads * src.head_dim
    if rope_dim == "all":
        if stock and src.num_kv_heads > 1:
            raise ValueError(
                "--rope-dim all needs several rope pairs per frequency, which the stock format cannot express"
            )
        return full
    rope_dim = int(rope_dim)
    if rope_dim <= 0 or rope_dim % 2 or rope_dim > full:
        raise ValueError(f"rope dim must be even and in 2..{full} (or 'all'), got {rope_dim}")
    return rope_dim


def stock_slots(theta: float, rope_dim: int) -> torch.Tensor:
    """DeepSeek's standard rope angles [dr/2] for rope_theta."""
    return default_inv_freq(rope_dim, theta, torch.float64)


def choose_theta(src: SourceModel, stats: list[LayerStats], rope_dim: int) -> float:
    """The stock rope_theta (from THETA_GRID) whose schedule keeps the most score energy."""
    best, best_gain = src.rope_theta, -1.0
    energies = [layer_energy(src, i, st) for i, st in enumerate(stats)]  # independent of theta: once
    for theta in tqdm(THETA_GRID + [src.rope_theta], desc="choosing stock rope_theta", leave=False):
        slots = stock_slots(theta, rope_dim)
        gain = sum(rope_plan.stock_gain(e, phi, st.dist, src.inv_freq, slots) for (e, phi), st in zip(energies, stats))
        if gain > best_gain:
            best, best_gain = theta, gain
    return best


def layer_energy(src, i, st) -> tuple[torch.Tensor, torch.Tensor]:
    """(e [H, Hkv, P], φ [H, P]) of layer i: score energy per head and (component, frequency), mean phases."""
    wq, wk, _, _ = augmented_weights(src, i)
    H, Hkv = src.num_heads, src.num_kv_heads
    qe = rope_plan.query_energy(wq, st.xx, H)
    weight = qe.view(Hkv, H // Hkv, -1).sum(1)
    _, unmix, lam = rope_plan.weighted_pca(rope_plan.key_covariance(wk, st.xx, Hkv), weight)
    return rope_plan.head_energy(unmix, lam, qe, H // Hkv), rope_plan.phase_means(st.dist, src.inv_freq)


def plan_rope(src: SourceModel, stats: list[LayerStats], settings: ConvertOptions):
    """(plans per layer, rope_dim, theta or None, dn)."""
    dr = resolve_rope_dim(src, settings.rope_dim, settings.stock)
    theta = None
    if settings.stock:
        theta = settings.rope_theta or choose_theta(src, stats, dr)
    plans = []
    for i, st in enumerate(stats):
        wq, wk, _, _ = augmented_weights(src, i)
        slots = stock_slots(theta, dr) if settings.stock else None
        plans.append(
            rope_plan.plan_layer(
                wq, wk, st.xx, st.dist, src.inv_freq, src.num_heads, src.num_kv_heads, dr, slots, settings.rope_window
            )
        )
    dn = max(2, 2 * max(len(p.nope_freqs) for p in plans))
    return plans, dr, theta, dn


def latent_problem(src, i, plan, st, dn, k_weight):
    """(W_Z [n_z, D+1], weight M, n_k) of layer i's latent, M in attention-output units (latent.py)."""
    wq, wk, wv, wo = augmented_weights(src, i)
    fk = key_features(plan, wk, src.num_kv_heads)
    wz = torch.cat([fk, wv], 0)
    n_k = fk.shape[0]
    H, d = src.num_heads, src.head_dim
    wo_blocks = wo.view(wo.shape[0], H, d).permute(1, 0, 2)
    m = lat.attention_weight(
        n_k,
        key_maps(plan, src.num_kv_heads, dn),
        nope_queries(plan, wq, H, dn),
        st.xx,
        wo_blocks,
        H // src.num_kv_heads,
        st.rho,
        st.kappa,
        d,
    )
    m[:n_k, :n_k] *= k_weight
    return wz, m, n_k


def resolve_ranks(kv_rank, full: list[int]) -> list[int]:
    """Per-layer latent widths from an int (the same in every layer), "full" or a per-layer list."""
    if kv_rank in ("full", None):
        return list(full)
    if isinstance(kv_rank, (list, tuple)):
        return [min(int(r), f) for r, f in zip(kv_rank, full)]
    r = int(kv_rank)
    if r < 1:
        raise ValueError(f"kv rank must be >= 1 or 'full', got {kv_rank}")
    return [min(r, f) for f in full]


STOCK_NORM_EPS = 1e-6  # DeepSeek's rms_norm_eps; transformers hard-codes it for kv_a_layernorm
STOCK_LATENT_MS = 0.01 * STOCK_NORM_EPS  # latent mean square: 1% of eps keeps the norm ~linear


def linearize_norm(fact: lat.Factorization, rms: float) -> lat.Factorization:
    """Scale the latent so the stock kv_a_layernorm (unit weight) is almost linear.

    RMSNorm divides each token's latent by √(mean(c²) + eps), erasing its norm. With the
    latent's mean square at 1% of eps, that divisor is √eps·(1 ± ~0.5%) for every token,
    so the norm becomes a constant gain that kv_b_proj undoes. Runtimes must use eps 1e-6
    for kv_a_layernorm (transformers hard-codes it; vLLM/SGLang read rms_norm_eps, which
    the stock config sets to 1e-6).
    """
    target = STOCK_LATENT_MS**0.5
    gain = (STOCK_LATENT_MS + STOCK_NORM_EPS) ** 0.5
    return lat.Factorization(fact.latent * (target / rms), fact.recon * (rms / target) * gain, fact.spectrum)


def latent_rms(fact: lat.Factorization, xx: torch.Tensor, rank: int) -> float:
    """Typical RMS of the latent c (√(E|c|²/r)), the stock kv_a_layernorm's scale."""
    lt = fact.latent[:rank]
    return float((((lt @ xx) * lt).sum() / rank).clamp(min=1e-30).sqrt())


def convert_parts(
    src: SourceModel,
    stats: list[LayerStats],
    settings: ConvertOptions,
    plans_info=None,
    dtype=torch.float32,
    windows: torch.Tensor | None = None,
):
    """(DeepSeek-V3 config dict, info dict, parts): `parts` yields the converted tensors a piece at a
    time — the embeddings and final norm, then one dict per layer, each layer computed (and its
    source weights read) only when it is asked for, so a caller that writes each part and lets it
    go holds one layer of the output. windows [N, T]: the calibration windows, which
    settings.refine_steps > 0 needs (refine.py; the parts must then be taken in order)."""
    if settings.refine_steps and windows is None:
        raise ValueError("refine_steps needs the calibration windows")
    plans, dr, theta, dn = plans_info or plan_rope(src, stats, settings)
    full = [2 * int(p.dropped.sum()) + src.num_kv_heads * src.head_dim for p in plans]  # rows of Z = [f_K; V]
    ranks = resolve_ranks(settings.kv_rank, full)
    # stock: one global width; a layer that needs less is padded with zero latent dims (the same model)
    width = int(settings.kv_rank) if settings.stock and isinstance(settings.kv_rank, int) else None
    if settings.stock and len(set(ranks)) > 1 and not width:
        raise ValueError("the stock format needs one global rank")
    used, ranks = ranks, [width] * len(ranks) if width else ranks
    cfg = deepseek_config(
        src,
        dn=dn,
        dr=dr,
        ranks=ranks,
        stock=settings.stock,
        theta=theta,
        inv_freq=[p.slot_freq.tolist() for p in plans],
        dtype=dtype,
    )
    info = {
        "ranks": ranks,
        "latent_used": used,
        "rope_dim": dr,
        "nope_dim": dn,
        "rope_theta": theta,
        "kept_pairs": [p.kept.tolist() for p in plans],
    }
    scale = ((dn + dr) / src.head_dim) ** 0.5

    def parts():
        top = ["model.embed_tokens.weight", "model.norm.weight"] + (
            [] if src.tie_word_embeddings else ["lm_head.weight"]
        )
        first = {name: src.tensors[name].to(dtype) for name in top}
        if src.tie_word_embeddings and settings.stock:  # vLLM's DeepseekV2ForCausalLM ignores tie_word_embeddings
            first["lm_head.weight"] = first["model.embed_tokens.weight"].clone()
        yield first
        refiner = (
            Refiner(src, windows, settings.refine_steps, settings.refine_lr, settings.refine_inputs)
            if settings.refine_steps
            else None
        )
        for i, st in enumerate(stats):
            wz, m, _ = latent_problem(src, i, plans[i], st, dn, settings.k_weight)
            fact = lat.factorize(wz, st.xx, m, used[i])
            yield layer_tensors(
                src, i, plans[i], fact, dn, scale, settings.stock, st, dtype, width, refiner, settings.rotate_latent
            )
        if refiner:
            info["refined"] = [f and {"before": f.before, "after": f.after, "kept": f.kept} for f in refiner.fits]

    return cfg, info, parts()


def build_model(
    src: SourceModel,
    stats: list[LayerStats],
    settings: ConvertOptions,
    plans_info=None,
    dtype=torch.float32,
    windows: torch.Tensor | None = None,
):
    """Converted model in memory: (DeepSeek-V3 config dict, tensors by name, info dict)."""
    cfg, info, parts = convert_parts(src, stats, settings, plans_info, dtype, windows)
    tensors = {}
    for part in parts:
        tensors.update(part)
    return cfg, tensors, info


def stock_latent(w: dict, width: int | None, xx: torch.Tensor) -> dict:
    """A layer's tensors (build_layer's) with the stock latent: padded to width with zero dims and
    scaled for the kv_a_layernorm (linearize_norm). Both act on the latent's rows of kv_a_aug and
    kv_b's columns alike, so they come after refinement, whatever it did to the latent."""
    r = w["kv_b"].shape[1]
    fact = lat.Factorization(latent=w["kv_a_aug"][:r], recon=w["kv_b"], spectrum=torch.empty(0))
    if width:
        fact = lat.pad(fact, width)
    fact = linearize_norm(fact, latent_rms(fact, xx, fact.latent.shape[0]))
    return {**w, "kv_a_aug": torch.cat([fact.latent, w["kv_a_aug"][r:]]), "kv_b": fact.recon}


def layer_tensors(
    src, i, plan, fact, dn, scale, stock, st, dtype, width=None, refiner=None, rotate=True
) -> dict[str, torch.Tensor]:
    """Layer i's tensors under DeepSeek-V3 names; width pads the (stock) latent with zero dims;
    refiner: refine.Refiner (None: the closed form as it is); rotate: mix the latent (latent.rotate),
    else it stays in its PCA basis, directions in order of energy (a transform-coded cache's)."""
    wq, wk, wv, wo = augmented_weights(src, i)
    exact = not plan.dropped.any() and fact.latent.shape[0] >= fact.recon.shape[0]  # nothing to refine
    if rotate:
        fact = lat.rotate(fact, seed=i)
    w = build_layer(plan, fact, wq, wk, wv, wo, src.num_heads, src.num_kv_heads, dn, scale)
    if refiner:
        w = refiner.layer(i, w, plan.slot_freq, dn, exact and not stock)
    w = equalize_rope_pairs(w, st.xx, src.num_heads)
    if stock:
        w = stock_latent(w, width, st.xx)
    layer = src.layer(i)
    p = f"model.layers.{i}."
    out = {
        p + "input_layernorm.weight": layer["attn_norm"],
        p + "post_attention_layernorm.weight": layer["mlp_norm"],
        p + "mlp.gate_proj.weight": layer["gate"],
        p + "mlp.up_proj.weight": layer["up"],
        p + "mlp.down_proj.weight": layer["down"],
        p + "self_attn.q_proj.weight": w["q_aug"][:, :-1],
        p + "self_attn.kv_a_proj_with_mqa.weight": w["kv_a_aug"][:, :-1],
        p + "self_attn.kv_b_proj.weight": w["kv_b"],
        p + "self_attn.o_proj.weight": w["o"],
    }
    if src.qkv_bias:
        out[p + "self_attn.q_proj.bias"] = w["q_aug"][:, -1]
        out[p + "self_attn.kv_a_proj_with_mqa.bias"] = w["kv_a_aug"][:, -1]
        out[p + "self_attn.o_proj.bias"] = torch.zeros(src.hidden_size, dtype=torch.float64)
    if stock:
        out[p + "self_attn.kv_a_layernorm.weight"] = torch.ones(w["kv_b"].shape[1], dtype=torch.float64)
    return {k: v.to(dtype).contiguous() for k, v in out.items()}
