"""`--rope-dim all --kv-rank full` must reproduce the source: the conversion algebra is exact."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from latentkv.convert.calibrate import collect_stats
from latentkv.convert.export import export, write_card
from latentkv.convert.layout import converted_model
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model
from latentkv.model.loader import checkpoint_tensors, load_model
from latentkv.sources.readers import default_gguf_path, read_source
from latentkv.sources.reference import source_logits

import llama_tiny


def convert_exact(src, tmp_path, windows):
    """Exact conversion written as a native folder; returns (folder, cfg, tensors)."""
    stats = collect_stats(src, windows)
    cfg, tensors, info = build_model(src, stats, ConvertOptions(rope_dim="all", kv_rank="full"))
    out = export(tmp_path / "mla", src, cfg, tensors, info, {"rope_dim": "all", "kv_rank": "full"})
    write_card(out, src, cfg, info, {}, {})
    return out, cfg, tensors


@pytest.mark.parametrize("kind", ["llama_gqa", "llama_mha", "qwen2_bias", "mistral"])
def test_tiny_full_rank_matches_transformers(tmp_path, kind):
    hf = llama_tiny.save(kind, tmp_path / "src")
    src = read_source(tmp_path / "src")
    ids = torch.randint(0, llama_tiny.VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
    assert (source_logits(src, ids) - expected).abs().max() <= 1e-4  # the reader and reference forward
    windows = torch.randint(0, llama_tiny.VOCAB, (3, 48), generator=torch.Generator().manual_seed(2))
    out, cfg, tensors = convert_exact(src, tmp_path, windows)
    assert cfg["qk_rope_head_dim"] == src.num_kv_heads * src.head_dim
    assert (converted_model(cfg, tensors).full_logits(ids) - expected).abs().max() <= 1e-3  # in memory, as measured
    model = load_model(out, dtype=torch.float32)
    assert (model.full_logits(ids) - expected).abs().max() <= 1e-3
    assert (model.full_logits(ids, path="absorbed") - expected).abs().max() <= 1e-3
    # the packed q_proj + kv_a_proj_with_mqa, with their biases for qwen2_bias, split back exactly
    stored, exported = load_file(out / "model.safetensors"), checkpoint_tensors(model)
    assert sorted(exported) == sorted(stored) and all(torch.equal(exported[k], stored[k]) for k in stored)


@pytest.mark.slow  # the real SmolLM2, converted
def test_smollm2_full_rank_matches_transformers(tmp_path, smollm2, smollm2_tokenizer):
    from transformers import AutoModelForCausalLM

    path = default_gguf_path()
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    windows = torch.randint(0, smollm2.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    out, _, _ = convert_exact(smollm2, tmp_path, windows)
    model = load_model(out, dtype=torch.float32)
    for prompt in ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a land far away,"]:
        ids = torch.tensor([smollm2_tokenizer.encode(prompt)])
        with torch.no_grad():
            expected = hf(ids).logits
        assert (model.full_logits(ids) - expected).abs().max() <= 1e-3, prompt
    assert (out / "tokenizer.json").is_file() or (out / "tokenizer_config.json").is_file()
    assert (out / "generation_config.json").is_file() and (out / "README.md").is_file()
