"""The stock export is a plain deepseek_v3 checkpoint: transformers and our loader agree on it."""

from __future__ import annotations

import json

import torch

from latentkv.convert.calibrate import collect_stats
from latentkv.convert.export import export
from latentkv.convert.layout import converted_model
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model
from latentkv.model.loader import load_model
from latentkv.sources.readers import read_source

import llama_tiny


def test_stock_export_loads_in_transformers(tmp_path):
    from transformers import DeepseekV3ForCausalLM

    llama_tiny.save("llama_gqa", tmp_path / "src")
    src = read_source(tmp_path / "src")
    windows = torch.randint(0, llama_tiny.VOCAB, (3, 64), generator=torch.Generator().manual_seed(2))
    stats = collect_stats(src, windows)
    cfg, tensors, info = build_model(src, stats, ConvertOptions(rope_dim=8, kv_rank=24, stock=True))
    out = export(tmp_path / "stock", src, cfg, tensors, info, {"stock": True})
    written = json.loads((out / "config.json").read_text())
    assert "latentkv" not in written and written["rope_interleave"] is True
    assert written["kv_lora_rank"] == 24 and written["q_lora_rank"] is None
    assert written["first_k_dense_replace"] == written["num_hidden_layers"]
    ids = torch.randint(0, llama_tiny.VOCAB, (2, 50), generator=torch.Generator().manual_seed(3))
    hf = DeepseekV3ForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        expected = hf(ids).logits
    ours = load_model(out, dtype=torch.float32).full_logits(ids)
    assert (ours - expected).abs().max() <= 1e-4
    assert (converted_model(cfg, tensors).full_logits(ids) - expected).abs().max() <= 1e-4
