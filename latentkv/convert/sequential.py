"""Layer-by-layer calibration: refit each layer's latent on the converted model's activations.

A first pass on the source's activations fixes the RoPE plans and ranks; the second pass
runs the calibration windows through the already-converted layers 0..l-1 and refits layer
l's latent on what it will actually see, so errors do not compound unseen.
"""
from __future__ import annotations

import torch

from latentkv.convert import latent as lat
from latentkv.convert.calibrate import LayerStats, collect_stats
from latentkv.convert.layout import converted_model
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model, latent_problem, layer_tensors, plan_rope
from latentkv.convert.source_model import SourceModel
from latentkv.model.loader import load_weights


def build_sequential(src: SourceModel, stats: list[LayerStats], windows: torch.Tensor, settings: ConvertOptions,
                     dtype=torch.float32, plans_info=None):
    """(config, tensors, info) like build_model, each latent refit on converted activations."""
    plans_info = plans_info or plan_rope(src, stats, settings)
    cfg, tensors, info = build_model(src, stats, settings, plans_info, dtype=torch.float32)
    plans, dr, _, dn = plans_info
    ranks = info["ranks"]
    scale = ((dn + dr) / src.head_dim) ** 0.5
    model = converted_model(cfg, tensors)

    def refit(i: int, st: LayerStats) -> None:
        wz, m, _ = latent_problem(src, i, plans[i], st, dn, settings.weighting, settings.k_weight)
        fact = lat.factorize(wz, st.xx, m, info["latent_used"][i])
        width = ranks[i] if settings.stock else None  # a padded stock latent stays padded
        layer = layer_tensors(src, i, plans[i], fact, dn, scale, settings.stock, st, torch.float32, width)
        tensors.update(layer)
        load_weights(model, ((name, t, "refit") for name, t in layer.items()), torch.float32, partial=True)

    def converted_layer(i: int, h: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return model.forward_layer(i, h)  # positions 0..T-1, as collect_stats passes them

    collect_stats(src, windows, next_layer=converted_layer, on_layer=refit)
    return {**cfg}, {k: v.to(dtype) for k, v in tensors.items()}, {**info, "sequential": True}
