"""Local refinement (refine.py): the MLA attention it fits, the objective it lowers, exactness and
determinism, and the options that switch it on."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from latentkv.convert import refine
from latentkv.convert.calibrate import collect_stats
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model
from latentkv.model.norm import rms_norm
from latentkv.sources.readers import read_source
from latentkv.sources.reference import attention, embed

import llama_tiny

LOW = ConvertOptions(rope_dim=4, kv_rank=6, refine_lr=1e-2)  # far from exact: 4 of 32 rope dims, rank 6


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(source, calibration windows [16, 64], statistics) of a tiny random GQA Llama."""
    folder = tmp_path_factory.mktemp("tiny") / "src"
    llama_tiny.save("llama_gqa", folder)
    src = read_source(folder)
    windows = torch.randint(0, llama_tiny.VOCAB, (16, 64), generator=torch.Generator().manual_seed(3))
    return src, windows, collect_stats(src, windows)


def layer0_inputs(src, windows):
    """(normed input of layer 0 [N, T, D], the source's attention output on it)."""
    layer = src.layer(0)
    x = rms_norm(embed(src, windows), layer["attn_norm"], src.rms_norm_eps)
    return x, attention(src, layer, x, torch.arange(windows.shape[1]))


def layer0_weights(cfg, tensors):
    """(refine's tensors of layer 0 from a converted model without biases, its rope slots' angles)."""
    p = "model.layers.0.self_attn."

    def aug(w):
        return torch.cat([w, torch.zeros(w.shape[0], 1)], 1)

    w = {
        "q_aug": aug(tensors[p + "q_proj.weight"]),
        "kv_a_aug": aug(tensors[p + "kv_a_proj_with_mqa.weight"]),
        "kv_b": tensors[p + "kv_b_proj.weight"],
        "o": tensors[p + "o_proj.weight"],
    }
    return w, torch.tensor(cfg["latentkv"]["rope_inv_freq"][0])


def test_mla_attention_of_the_exact_conversion_is_the_source_attention(tiny):
    src, windows, stats = tiny
    cfg, tensors, _ = build_model(src, stats, ConvertOptions(rope_dim="all", kv_rank="full"))
    w, slot_freq = layer0_weights(cfg, tensors)
    x, target = layer0_inputs(src, windows)
    out = refine.mla_attention(w, slot_freq, x, src.num_heads, cfg["qk_nope_head_dim"])
    assert (out - target).abs().max() <= 1e-4 * target.abs().max()


def test_refinement_lowers_the_layer_objective_on_held_out_windows(tiny):
    src, windows, stats = tiny
    _, _, info = build_model(src, stats, replace(LOW, refine_steps=30), windows=windows)
    fits = info["refined"]
    assert len(fits) == src.num_layers and all(f["kept"] for f in fits)
    assert all(f["after"] < f["before"] for f in fits)  # the held-out loss, measured before and after


def test_refinement_keeps_the_exact_conversion_exact(tiny):
    src, windows, stats = tiny
    exact = ConvertOptions(rope_dim="all", kv_rank="full")
    _, plain, _ = build_model(src, stats, exact)
    _, refined, info = build_model(src, stats, replace(exact, refine_steps=5), windows=windows)
    assert info["refined"] == [None] * src.num_layers  # no layer refined: nothing to gain
    assert all(torch.equal(plain[k], refined[k]) for k in plain)


def test_refinement_is_deterministic(tiny):
    src, windows, stats = tiny
    runs = [
        build_model(src, stats, replace(LOW, refine_steps=5, refine_inputs=inputs), windows=windows)[1]
        for inputs in ("converted", "converted", "source")
    ]
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    assert not all(torch.equal(runs[0][k], runs[2][k]) for k in runs[0])  # the inputs matter past layer 0


def test_held_out_loss_decides_whether_a_layer_is_kept(tiny):
    src, windows, stats = tiny
    x, target = layer0_inputs(src, windows)
    cfg, tensors, _ = build_model(src, stats, LOW)
    w, slot_freq = layer0_weights(cfg, tensors)
    # a learning rate that wrecks the layer: rejected, the input tensors come back untouched
    out, fit = refine.refine_layer(w, slot_freq, x, target, src.num_heads, cfg["qk_nope_head_dim"], 5, 10.0, seed=0)
    assert not fit.kept and fit.after >= fit.before and out is w


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("refine_steps", -1, "refine_steps"),
        ("refine_lr", 0.0, "refine_lr"),
        ("refine_inputs", "both", "refine_inputs"),
    ],
)
def test_bad_refine_options_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        ConvertOptions(**{field: value}).check()


def test_the_stock_export_is_refined_too(tiny):
    src, windows, stats = tiny
    stock = ConvertOptions(rope_dim=4, kv_rank=8, stock=True, target="any", refine_steps=30, refine_lr=1e-2)
    cfg, tensors, info = build_model(src, stats, stock, windows=windows)
    assert all(f["kept"] and f["after"] < f["before"] for f in info["refined"])
    assert "latentkv" not in cfg and cfg["kv_lora_rank"] == 8  # still the plain deepseek_v3 layout


def test_refinement_needs_the_calibration_windows(tiny):
    src, _, stats = tiny
    with pytest.raises(ValueError, match="calibration windows"):
        build_model(src, stats, replace(LOW, refine_steps=1))
