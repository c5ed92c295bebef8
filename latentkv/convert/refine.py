"""Local refinement: after the closed form, fit each MLA layer's attention output to the source's.

The closed form (latent.py, rope_plan.py) minimizes a first-order proxy — linear reconstruction error
weighted by second moments. Here each layer's converted weights (q_proj with its folded phases,
kv_a_proj_with_mqa: the latent and the rope key, kv_b_proj) are moved by Adam to minimize the
error of the layer's true attention output (causal softmax, RoPE at the real positions, o_proj
applied) against the source layer's on the calibration windows:

    loss = Σ |MLA(x) − Attn_src(x)|² / Σ |Attn_src(x)|²   over the windows' positions.

x is the normed input of the layer: the source's own (inputs="source") or the converted model's
after the already-refined layers below (inputs="converted", as GPTQ does), the target always the
source layer on that same x. The last windows (HOLDOUT) are not trained on: the refined weights
are kept only if they lower the loss there, so a layer the closed form already gets right (the
exact conversion: every rope pair kept, full rank) is never made worse — and such a layer is not
refined at all. Float32, seeded, the same bits for the same seed (one thread).
Shapes: windows [N, T]; hidden [N, T, D]; tensors as assemble.build_layer returns them.
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

TRAINED = ("q_aug", "kv_a_aug", "kv_b")  # what the conversion chose; o_proj is the source's W_o
BATCH = 2  # windows per Adam step
CHUNK = 4  # windows per no-grad forward (bounded memory)
INPUTS = ("converted", "source")
WARMUP = 0.25  # share of the steps


def holdout(n: int) -> int:
    """Windows kept out of training to accept or reject a layer's refinement (1 in 8, at least 1)."""
    return max(1, n // 8) if n > 1 else 0


def mla_attention(w: dict, slot_freq: torch.Tensor, x: torch.Tensor, num_heads: int, dn: int) -> torch.Tensor:
    """Attention output [B, T, D] of one MLA layer (as latentkv.model computes it, float32) on the
    normed input x [B, T, D] at positions 0..T-1. w: q_aug [H*(dn+dr), D+1], kv_a_aug [r+dr, D+1],
    kv_b [H*(dn+dv), r], o [D, H*dv] (biases as last columns); slot_freq [dr/2]: each rope slot's angle
    per token (interleaved pairs, as the converter writes them)."""
    B, T, _ = x.shape
    H, dr = num_heads, 2 * slot_freq.shape[0]
    r = w["kv_a_aug"].shape[0] - dr
    q = F.linear(x, w["q_aug"][:, :-1], w["q_aug"][:, -1]).view(B, T, H, dn + dr).transpose(1, 2)
    kv = F.linear(x, w["kv_a_aug"][:, :-1], w["kv_a_aug"][:, -1])
    cos, sin = cos_sin(torch.arange(T), slot_freq)  # [T, dr/2]
    q = torch.cat([q[..., :dn], rotate(q[..., dn:], cos, sin, interleaved=True)], -1)
    k_rope = rotate(kv[..., r:], cos, sin, interleaved=True)[:, None].expand(B, H, T, dr)
    kvb = F.linear(kv[..., :r], w["kv_b"]).view(B, T, H, -1).transpose(1, 2)
    k = torch.cat([kvb[..., :dn], k_rope], -1)
    out = F.scaled_dot_product_attention(q, k, kvb[..., dn:], is_causal=True, scale=(dn + dr) ** -0.5)
    return F.linear(out.transpose(1, 2).reshape(B, T, -1), w["o"])


def relative_error(w, slot_freq, x, target, num_heads, dn) -> float:
    """Σ|MLA(x) − target|² / Σ|target|² over windows x [N, T, D], in chunks (no graph kept)."""
    err = tot = 0.0
    with torch.no_grad():
        for b in range(0, x.shape[0], CHUNK):
            t = target[b : b + CHUNK]
            err += float((mla_attention(w, slot_freq, x[b : b + CHUNK], num_heads, dn) - t).square().sum())
            tot += float(t.square().sum())
    return err / max(tot, 1e-30)


def row_scale(w: torch.Tensor) -> torch.Tensor:
    """[rows, 1] each row's RMS (the tensor's where a row is all but zero): the unit of its Adam step."""
    rms = w.square().mean(1, keepdim=True).sqrt()
    return torch.maximum(rms, 1e-3 * w.square().mean().sqrt()).clamp(min=1e-30)


def schedule(step: int, steps: int) -> float:
    """The learning rate's factor: a linear warm-up over the first WARMUP of the steps (Adam's first
    steps are full-size whatever the gradient), then a linear decay to 0."""
    warm = max(1, round(WARMUP * steps))
    return (step + 1) / warm if step < warm else max(0.0, (steps - step) / max(1, steps - warm))


@dataclass
class LayerFit:
    """What refining one layer did: loss on the held-out windows before and after, steps run, kept."""

    before: float
    after: float
    steps: int
    kept: bool


def refine_layer(
    w: dict, slot_freq, x, target, num_heads: int, dn: int, steps: int, lr: float, seed: int, desc: str = "refining"
) -> tuple[dict, LayerFit]:
    """(tensors, fit): w's TRAINED tensors after `steps` Adam steps on windows x [N, T, D] against the
    source's attention output target [N, T, D]; w itself if that does not lower the held-out loss.

    Each trained tensor W moves as W0 + rms_row(W0)·δ with δ the Adam variable (starting at 0), so lr
    is a step relative to each row's own scale whatever the latent's gauge; lr follows schedule()."""
    n_hold = holdout(x.shape[0])
    train = x.shape[0] - n_hold
    w32 = {k: v.float() for k, v in w.items()}
    sf = slot_freq.float()
    scale = {k: row_scale(w32[k]) for k in TRAINED}
    delta = {k: torch.zeros_like(w32[k], requires_grad=True) for k in TRAINED}
    opt = torch.optim.Adam(list(delta.values()), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: schedule(s, steps))
    gen = torch.Generator().manual_seed(seed)

    def current():
        return {**w32, **{k: w32[k] + scale[k] * delta[k] for k in TRAINED}}

    hold_x, hold_t = x[train:], target[train:]
    before = relative_error(w32, sf, hold_x, hold_t, num_heads, dn)
    for _ in tqdm(range(steps), desc=desc, unit="step", leave=False):
        idx = torch.randperm(train, generator=gen)[:BATCH]
        t = target[idx]
        loss = (mla_attention(current(), sf, x[idx], num_heads, dn) - t).square().sum() / t.square().sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    with torch.no_grad():
        refined = {k: v.detach() for k, v in current().items()}
    after = relative_error(refined, sf, hold_x, hold_t, num_heads, dn)
    if not after < before:
        return w, LayerFit(before, after, steps, False)
    return {**w, **{k: refined[k].to(w[k].dtype) for k in TRAINED}}, LayerFit(before, after, steps, True)


class Refiner:
    """The residual stream of the calibration windows carried up the layers, to refine each layer in
    turn (pipeline.convert_parts calls `layer` for layers 0, 1, … in order).

    inputs="source": each layer sees the source's hidden states; "converted": the converted model's,
    through the layers already refined (attention converted, MLP the source's)."""

    def __init__(
        self, src: SourceModel, windows: torch.Tensor, steps: int, lr: float, inputs: str = "converted", seed: int = 0
    ):
        if windows.shape[0] < 2:
            raise ValueError("refinement needs at least 2 calibration windows (one is held out)")
        self.src, self.steps, self.lr, self.inputs, self.seed = src, steps, lr, inputs, seed
        with torch.no_grad():
            self.hidden = ref.embed(src, windows).float()
        self.fits: list[LayerFit | None] = []

    def layer(self, i: int, w: dict, slot_freq: torch.Tensor, dn: int, exact: bool) -> dict:
        """Layer i's tensors refined (unchanged where exact); advances the stream past layer i."""
        src, layer = self.src, self.src.layer(i)
        x, target = self.inputs_and_target(layer)
        fit = None
        if not exact and self.steps > 0:
            w, fit = refine_layer(
                w,
                slot_freq,
                x,
                target,
                src.num_heads,
                dn,
                self.steps,
                self.lr,
                self.seed + i,
                desc=f"refining layer {i}",
            )
            tqdm.write(
                f"refined layer {i}: held-out attention error {fit.before:.4f} -> {fit.after:.4f}"
                f"{'' if fit.kept else ' (not lower: closed form kept)'}"
            )
        self.fits.append(fit)
        with torch.no_grad():
            w32 = {k: v.float() for k, v in w.items()}
            for b in range(0, x.shape[0], CHUNK):
                out = (
                    target[b : b + CHUNK]
                    if self.inputs == "source"
                    else mla_attention(w32, slot_freq.float(), x[b : b + CHUNK], src.num_heads, dn)
                )
                h = self.hidden[b : b + CHUNK] + out
                self.hidden[b : b + CHUNK] = h + ref.mlp(layer, rms_norm(h, layer["mlp_norm"], src.rms_norm_eps))
        return w

    def inputs_and_target(self, layer: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, the source's attention output on x), both [N, T, D] float32."""
        src = self.src
        x = rms_norm(self.hidden, layer["attn_norm"], src.rms_norm_eps)
        positions = torch.arange(x.shape[1])
        with torch.no_grad():
            target = torch.cat(
                [ref.attention(src, layer, x[b : b + CHUNK], positions) for b in range(0, x.shape[0], CHUNK)]
            )
        return x, target
