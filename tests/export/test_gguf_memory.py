"""Streaming: an export holds about one decoder layer, however many layers the folder has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from latentkv.config import ModelConfig
from latentkv.export.checkpoint import expected_shapes
from tiny_lm import VOCAB, build_tokenizer

MEMORY_SCRIPT = r"""
import json, sys, torch
from pathlib import Path
from latentkv.export import export_gguf
from latentkv.sizes import peak_rss, reset_peak_rss

torch.set_num_threads(1)

assert reset_peak_rss()  # the peak (VmHWM) restarts from the current RSS
before = peak_rss()
export_gguf(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
print(json.dumps({"before": before, "peak": peak_rss()}))
"""
# 12 MoE layers of 8 experts 512 x 512 (28 MiB of float32 each, 336 MiB in all)
CONFIG = dict(
    model_type="deepseek_v3",
    vocab_size=VOCAB,
    hidden_size=512,
    intermediate_size=512,
    num_hidden_layers=12,
    num_attention_heads=4,
    kv_lora_rank=64,
    q_lora_rank=None,
    qk_nope_head_dim=32,
    qk_rope_head_dim=32,
    v_head_dim=32,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    moe_intermediate_size=512,
    first_k_dense_replace=0,
    max_position_embeddings=256,
)


def write_random_deepseek(folder: Path) -> int:
    """The config's checkpoint with random float32 weights, one safetensors shard per layer; returns
    the bytes of the largest layer."""
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(CONFIG))
    build_tokenizer().save_pretrained(str(folder))
    shapes = expected_shapes(ModelConfig.from_dict(CONFIG))
    gen = torch.Generator().manual_seed(0)
    groups: dict[str, dict] = {}
    for name, shape in shapes.items():
        group = name.split(".")[2] if name.startswith("model.layers.") else "top"
        groups.setdefault(group, {})[name] = torch.randn(shape, generator=gen) * 0.05
    weight_map, largest = {}, 0
    for k, (group, tensors) in enumerate(groups.items()):
        shard = f"model-{k:05d}.safetensors"
        save_file(tensors, str(folder / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
        if group != "top":
            largest = max(largest, sum(t.numel() * 4 for t in tensors.values()))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return largest


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's resettable peak RSS")
def test_export_memory_is_about_one_layer(tmp_path):
    """Holding every layer (336 MiB) breaks the bound of a few layers. q8_0: the quantizer's
    temporaries too (one expert at a time). Measured: 58 MiB grown (the layer read, and its experts
    stacked); the whole model when the shards stayed mapped while later layers were read."""
    layer = write_random_deepseek(tmp_path / "rand")
    # a fixed mmap threshold, as tests/convert/test_convert_memory.py says why: RSS then measures what
    # is held, not glibc's high-water mark of freed blocks
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 << 10)}
    run = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(tmp_path / "rand"), str(tmp_path / "m.gguf"), "q8_0"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    mem = json.loads(run.stdout.strip().splitlines()[-1])
    grown = mem["peak"] - mem["before"]
    assert grown <= 4 * layer + (64 << 20), (grown / 2**20, layer / 2**20)
    assert (tmp_path / "m.gguf").stat().st_size > CONFIG["num_hidden_layers"] * layer / 4  # q8_0: 8.5 bits a value
