"""The GGUF reader on a tiny Llama written with the gguf package the way llama.cpp lays it out."""

from __future__ import annotations

import pytest
import torch

from latentkv.sources.readers import SourceError, read_source
from latentkv.sources.reference import source_logits

import llama_tiny
from llama_tiny import write_gguf


def test_tiny_gguf_matches_transformers(tmp_path):
    model = llama_tiny.build("llama_gqa")
    write_gguf(tmp_path / "tiny.gguf", model)
    src = read_source(tmp_path / "tiny.gguf")
    assert (src.num_heads, src.num_kv_heads, src.head_dim) == (4, 2, 16) and not src.tie_word_embeddings
    ids = torch.randint(0, llama_tiny.VOCAB, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids).logits
    assert (source_logits(src, ids) - expected).abs().max() <= 1e-4


def test_gguf_missing_tensor_is_named(tmp_path):
    write_gguf(tmp_path / "cut.gguf", llama_tiny.build("llama_gqa"), skip="blk.1.attn_v.weight")
    with pytest.raises(SourceError, match=r"cut\.gguf: missing tensor model\.layers\.1\.self_attn\.v_proj\.weight"):
        read_source(tmp_path / "cut.gguf")
