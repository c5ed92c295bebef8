"""Streaming: sources are read a tensor at a time (tests/convert/test_convert_memory.py: a conversion holds
about one layer)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from latentkv.sources.readers import read_source

import llama_tiny
from llama_tiny import write_gguf
from random_llama import SHAPES, write_random_llama

SMALL = dict(SHAPES["small"], vocab_size=128)


def whole_file(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of every shard, read whole (safetensors' own loader), as float32."""
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors.update({k: v.float() for k, v in load_file(str(shard)).items()})
    return tensors


def test_random_llama_round_trips_through_the_hf_reader(tmp_path):
    folder = write_random_llama(tmp_path / "rand", tokenizer=False, **SMALL)
    cfg = json.loads((folder / "config.json").read_text())
    src = read_source(folder)
    assert (
        src.num_layers,
        src.hidden_size,
        src.num_heads,
        src.num_kv_heads,
        src.intermediate_size,
        src.vocab_size,
    ) == (4, 256, 8, 2, 512, 128)
    assert src.head_dim == 32 and src.rope_theta == cfg["rope_theta"] and not src.tie_word_embeddings
    expected = whole_file(folder)
    assert sorted(src.tensors) == sorted(expected) and len(list(folder.glob("*.safetensors"))) == 5
    assert all(torch.equal(src.tensors[k], v) for k, v in expected.items())


def test_streamed_safetensors_equal_the_whole_file_and_are_not_kept(tmp_path):
    folder = write_random_llama(tmp_path / "rand", tokenizer=False, **SMALL)
    streamed = read_source(folder, resident_limit=0).tensors
    expected = whole_file(folder)
    for name, tensor in expected.items():
        assert torch.equal(streamed[name], tensor), name
    assert streamed._cache == {}  # read on every access, never held
    resident = read_source(folder).tensors  # small: kept once read
    assert torch.equal(resident["model.norm.weight"], expected["model.norm.weight"]) and resident._cache


def test_streamed_gguf_equals_the_model_it_was_written_from(tmp_path):
    model = llama_tiny.build("llama_gqa")
    write_gguf(tmp_path / "tiny.gguf", model)
    streamed = read_source(tmp_path / "tiny.gguf", resident_limit=0).tensors
    for name, p in model.state_dict().items():  # Q / K rows back in Hugging Face order
        assert torch.equal(streamed[name], p.float()), name
    assert streamed._cache == {}
