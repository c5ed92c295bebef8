"""Bad sources fail with messages that name the file and what is wrong."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from latentkv.sources.gguf_reader import unpermute
from latentkv.sources.readers import SourceError, read_source

import llama_tiny


def test_corrupt_gguf_names_the_file(tmp_path):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 20)
    with pytest.raises(SourceError, match="broken.gguf"):
        read_source(bad)


def test_missing_tensor_is_named(tmp_path):
    llama_tiny.save("llama_gqa", tmp_path / "src")
    weights = tmp_path / "src" / "model.safetensors"
    tensors = load_file(str(weights))
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(SourceError, match=r"missing tensor model\.layers\.1\.self_attn\.k_proj\.weight"):
        read_source(tmp_path / "src")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}, "QK-norm"),
        ({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 64}, "sliding-window"),
        ({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, "GPT2LMHeadModel is not supported"),
        ({"mlp_bias": True}, "MLP biases"),
    ],
)
def test_unsupported_architectures_are_refused(tmp_path, change, message):
    llama_tiny.save("llama_gqa", tmp_path / "src")
    cfg_path = tmp_path / "src" / "config.json"
    cfg_path.write_text(json.dumps({**json.loads(cfg_path.read_text()), **change}))
    with pytest.raises(SourceError, match=message):
        read_source(tmp_path / "src")


def test_pickled_weights_are_not_loaded(tmp_path):
    llama_tiny.save("llama_gqa", tmp_path / "src")
    (tmp_path / "src" / "model.safetensors").rename(tmp_path / "src" / "pytorch_model.bin")
    with pytest.raises(SourceError, match="never loaded"):
        read_source(tmp_path / "src")


def test_missing_source_and_wrong_suffix(tmp_path):
    with pytest.raises(SourceError, match="not found"):
        read_source(tmp_path / "nothing")
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(SourceError, match="gguf"):
        read_source(tmp_path / "model.bin")


def test_unpermute_inverts_llama_cpp_permutation():
    # llama.cpp's convert_hf_to_gguf.permute, written out independently
    w = torch.randn(3 * 8, 5)
    permuted = w.reshape(3, 2, 4, 5).transpose(1, 2).reshape(24, 5)
    assert torch.equal(unpermute(permuted, 3), w)
