"""Stock widths a serving engine takes: snapping, forcing, and exact zero padding."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from latentkv.convert.api import resolve_sizes
from latentkv.convert.calibrate import collect_stats
from latentkv.convert.export import export
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model
from latentkv.convert.stock import TARGETS, snap_width, stock_size
from latentkv.model.loader import load_model
from latentkv.sources.readers import read_source

import llama_tiny

# SmolLM2-135M's attention shape: 3 KV heads x 64 dims = 384 cache elements per token per layer
SMOL = SimpleNamespace(num_kv_heads=3, head_dim=64, qkv_bias=False, kv_elements=lambda: 384)


@pytest.mark.parametrize(
    "width,target,expected",
    [
        (256, "vllm", 320),
        (400, "vllm", 320),
        (450, "vllm", 512),
        (560, "vllm", 576),
        (1000, "vllm", 576),
        (256, "vllm-cpu", 576),
        (320, "flashmla", 576),
        (256, "any", 256),
    ],
)
def test_snap_width_picks_the_nearest_supported(width, target, expected):
    assert snap_width(width, target) == expected


def test_cache_ratio_snaps_and_says_so(capsys):
    settings = resolve_sizes(SMOL, ConvertOptions(cache_ratio=0.667, stock=True))
    assert (settings.rope_dim, settings.kv_rank) == (64, 256)
    assert "stock width 256 snapped to 320" in capsys.readouterr().out


def test_forced_576_is_padded_and_flagged_larger_than_the_source():
    rope, rank, notes = stock_size(SMOL, None, 128, "vllm", width=576)
    assert (rope, rank) == (64, 512)
    assert any("larger than the original" in n and "1.50x" in n for n in notes)
    rope, rank, notes = stock_size(SMOL, None, "full", "vllm")
    assert (rope, rank, notes) == (
        64,
        448,
        [
            "the 512-wide stock cache is 1.33x the source's 384 elements per token "
            "per layer: larger than the original (it is the width vllm serves)"
        ],
    )


def test_every_target_width_is_reachable_and_bad_shapes_are_refused():
    for target, widths in TARGETS.items():
        for w in widths:
            assert sum(stock_size(SMOL, None, None, target, width=w)[:2]) == w
    with pytest.raises(ValueError, match="rope dim 64"):
        stock_size(SMOL, 32, 256, "vllm")
    with pytest.raises(ValueError, match="not one --target vllm-cpu takes"):
        stock_size(SMOL, None, None, "vllm-cpu", width=320)
    with pytest.raises(ValueError, match="unknown stock target"):
        stock_size(SMOL, None, None, "sglang")


def test_padded_stock_export_is_the_same_model(tmp_path):
    """A rank above what the source needs: zero latent dims, logits equal to the unpadded export."""
    from transformers import DeepseekV3ForCausalLM

    llama_tiny.save("llama_gqa", tmp_path / "src")
    src = read_source(tmp_path / "src")
    stats = collect_stats(src, torch.randint(0, llama_tiny.VOCAB, (3, 64), generator=torch.Generator().manual_seed(2)))
    cfg, tensors, info = build_model(src, stats, ConvertOptions(rope_dim=8, kv_rank="full", stock=True))
    full = cfg["kv_lora_rank"]
    cfg_p, tensors_p, info_p = build_model(src, stats, ConvertOptions(rope_dim=8, kv_rank=full + 12, stock=True))
    assert cfg_p["kv_lora_rank"] == full + 12 and info_p["latent_used"] == info["ranks"]
    kv_b = tensors_p["model.layers.0.self_attn.kv_b_proj.weight"]
    assert kv_b.shape[1] == full + 12 and kv_b[:, full:].abs().max() == 0
    ids = torch.randint(0, llama_tiny.VOCAB, (2, 40), generator=torch.Generator().manual_seed(3))
    logits = []
    for name, c, t in [("plain", cfg, tensors), ("padded", cfg_p, tensors_p)]:
        out = export(tmp_path / name, src, c, t, info, {"stock": True})
        assert json.loads((out / "config.json").read_text())["kv_lora_rank"] == c["kv_lora_rank"]
        hf = DeepseekV3ForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
        with torch.no_grad():
            logits.append(hf(ids).logits)
        assert (load_model(out, dtype=torch.float32).full_logits(ids) - logits[-1]).abs().max() <= 1e-4
    assert (logits[0] - logits[1]).abs().max() <= 1e-5
