"""Per-layer rank allocation by measured sensitivity.

Compress one layer at a time to the mean rank (all others exact), measure how much the
loss on a few calibration windows rises, and divide by that layer's predicted (weighted)
residual error: s_l = Δloss_l / Σ_{i>r} λ_{l,i}. Ranks are then handed out greedily to
the largest s_l·λ_{l,i} under the global budget.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from latentkv.convert import latent as lat
from latentkv.convert import reference as ref
from latentkv.convert.layout import converted_model
from latentkv.convert.source_model import SourceModel
from latentkv.model.norm import rms_norm


def layer_inputs(src: SourceModel, ids: torch.Tensor) -> list[torch.Tensor]:
    """Residual stream entering each layer, [L] of [B, T, D], for windows ids [B, T]."""
    positions = torch.arange(ids.shape[1])
    h = ref.embed(src, ids)
    inputs = []
    for i in range(src.num_layers):
        inputs.append(h)
        h = ref.decoder_layer(src, i, h, positions)
    return inputs


def loss_from(src: SourceModel, first: int, h: torch.Tensor, ids: torch.Tensor) -> float:
    """Mean next-token NLL when the stream h enters layer `first` and source layers follow."""
    positions = torch.arange(ids.shape[1])
    for i in range(first, src.num_layers):
        h = ref.decoder_layer(src, i, h, positions)
    logits = F.linear(rms_norm(h, src.tensors["model.norm.weight"], src.rms_norm_eps), src.lm_head())
    return float(F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten()))


@torch.no_grad()
def measure_scales(src: SourceModel, ids: torch.Tensor, cfg: dict, tensors: dict, spectra, ranks) -> list[float]:
    """s_l = loss rise from compressing layer l alone / its predicted residual error."""
    inputs = layer_inputs(src, ids)
    model = converted_model(cfg, tensors)
    base = loss_from(src, 0, inputs[0], ids)
    scales = []
    for i in tqdm(range(src.num_layers), desc="measuring layer sensitivity", unit="layer"):
        h = model.forward_layer(i, inputs[i])
        rise = max(loss_from(src, i + 1, h, ids) - base, 0.0)
        residual = float(spectra[i][ranks[i]:].sum())
        scales.append(rise / residual if residual > 0 else 0.0)
    floor = 1e-3 * max(scales + [1e-30])  # a layer measured as harmless still gets ranks last
    return [max(s, floor) for s in scales]


def allocate(spectra, scales, mean_rank: int, full: list[int]) -> list[int]:
    """Per-layer ranks (sum = mean_rank·L, each ≤ its full width) by scaled eigenvalues."""
    total = min(mean_rank * len(full), sum(full))
    ranks = lat.allocate_ranks(spectra, total, min_rank=max(1, mean_rank // 4), scales=scales)
    return [min(r, f) for r, f in zip(ranks, full)]
