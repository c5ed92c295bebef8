"""`latentkv bench random-model`: the shapes, seeded bytes, values on the Q4_0 grid, text that is
not one token, and the folder against transformers."""

from __future__ import annotations

import copy
import json
import math

import gguf
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, DeepseekV2Config, DeepseekV3Config

from latentkv.bench import random_model
from latentkv.bench.shapes import DEEPSEEK_V2_LITE, SHAPES
from latentkv.cli import main
from latentkv.config import ModelConfig
from latentkv.model.loader import load_model
from latentkv.model.shards import weight_files
from latentkv.model.quant import dequantize_int4, quantize_int4

HF_CONFIGS = {"deepseek_v2": DeepseekV2Config, "deepseek_v3": DeepseekV3Config}


def stored(folder) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in weight_files(folder):
        tensors.update(load_file(file))
    return tensors


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shapes_read_as_latentkv_and_transformers_configs(shape):
    raw = SHAPES[shape]
    ours, theirs = (
        ModelConfig.from_dict(raw),
        HF_CONFIGS[raw["model_type"]](**copy.deepcopy(raw)),
    )  # it edits rope_scaling
    for field in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "kv_lora_rank",
        "q_lora_rank",
        "qk_nope_head_dim",
        "qk_rope_head_dim",
        "v_head_dim",
        "n_routed_experts",
        "num_experts_per_tok",
        "n_shared_experts",
        "moe_intermediate_size",
        "first_k_dense_replace",
        "n_group",
        "topk_group",
        "routed_scaling_factor",
        "norm_topk_prob",
        "vocab_size",
        "max_position_embeddings",
    ):
        assert getattr(ours, field) == getattr(theirs, field), field
    assert ours.rope_scaling.rope_type == theirs.rope_parameters["rope_type"] == "yarn"
    assert ours.rope_scaling.factor == theirs.rope_parameters["factor"] == 40
    if raw["model_type"] == "deepseek_v3":
        assert (
            (ours.scoring_func, ours.topk_method) == ("sigmoid", "noaux_tc") and ours.q_lora_rank and ours.n_group > 1
        )


def test_deepseek_v2_lite_is_the_release():
    """The published config's fields, and its parameter count (15,706,484,224 in the release's shards)."""
    cfg = DEEPSEEK_V2_LITE
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["intermediate_size"], cfg["first_k_dense_replace"]) == (
        2048,
        27,
        10944,
        1,
    )
    assert (
        cfg["n_routed_experts"],
        cfg["num_experts_per_tok"],
        cfg["n_shared_experts"],
        cfg["moe_intermediate_size"],
    ) == (64, 6, 2, 1408)
    assert (cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]) == (16, None, 512)
    assert (cfg["qk_rope_head_dim"], cfg["qk_nope_head_dim"], cfg["v_head_dim"], cfg["vocab_size"]) == (
        64,
        128,
        128,
        102400,
    )
    assert (cfg["topk_method"], cfg["scoring_func"], cfg["norm_topk_prob"], cfg["routed_scaling_factor"]) == (
        "greedy",
        "softmax",
        False,
        1.0,
    )
    assert cfg["rope_scaling"] == {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    }
    assert (cfg["max_position_embeddings"], cfg["rope_theta"], cfg["rms_norm_eps"], cfg["torch_dtype"]) == (
        163840,
        10000,
        1e-6,
        "bfloat16",
    )
    assert sum(math.prod(s) for s in random_model.tensor_shapes(cfg).values()) == 15_706_484_224


def test_the_small_shapes_have_their_stated_sizes():
    params = {shape: sum(math.prod(s) for s in random_model.tensor_shapes(SHAPES[shape]).values()) for shape in SHAPES}
    assert 1e9 <= params["deepseek-v3-mini"] <= 3e9
    assert 100e6 <= 2 * params["mid"] <= 300e6  # bytes in bf16
    assert params["tiny"] < 10e6 and params["tiny-v3"] < 10e6


def test_the_same_seed_writes_the_same_bytes(bundled_source, tmp_path):
    one = random_model.write_random_model("tiny", tmp_path / "a", seed=3, source=bundled_source)
    again = random_model.write_random_model("tiny", tmp_path / "b", seed=3, source=bundled_source)
    sharded = random_model.write_random_model(
        "tiny", tmp_path / "c", seed=3, shard_bytes=1 << 20, source=bundled_source
    )
    other = random_model.write_random_model("tiny", tmp_path / "d", seed=4, source=bundled_source)
    assert (one / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()
    assert len(weight_files(sharded)) > 2
    tensors, in_shards, reseeded = stored(one), stored(sharded), stored(other)
    assert tensors.keys() == in_shards.keys() == reseeded.keys()
    assert all(torch.equal(tensors[n], in_shards[n]) for n in tensors)
    assert not any(torch.equal(tensors[n], reseeded[n]) for n in tensors if n.endswith("proj.weight"))


@pytest.mark.parametrize("shape", ["tiny", "tiny-v3"])
def test_linear_weights_round_trip_int4_and_q4_0_bit_for_bit(random_checkpoints, shape):
    """Every linear weight and the embedding: quantize_int4 (scale and zero stored in bf16, as the
    model stores them) and gguf's Q4_0 give back the bf16 values exactly."""
    tensors = stored(random_checkpoints(shape))
    grid = {n: t for n, t in tensors.items() if t.dim() == 2 and not n.endswith(".mlp.gate.weight")}
    assert "model.embed_tokens.weight" in grid and "lm_head.weight" in grid and len(grid) > 20
    for name, w in grid.items():
        assert w.dtype == torch.bfloat16, name
        codes, scale_zero = quantize_int4(w)
        assert torch.equal(dequantize_int4(codes, scale_zero.to(torch.bfloat16)), w.float()), name
        q4_0 = gguf.quants.quantize(w.float().numpy(), gguf.GGMLQuantizationType.Q4_0)
        assert np.array_equal(gguf.quants.dequantize(q4_0, gguf.GGMLQuantizationType.Q4_0), w.float().numpy()), name
        blocks = w.float().view(w.shape[0], -1, 32)
        assert torch.equal(blocks.amin(-1) * 7, blocks.amax(-1) * -8)  # one q = 0 and one q = 15 per block
    for name, t in tensors.items():
        if name.endswith(".mlp.gate.weight") or name.endswith("e_score_correction_bias"):
            assert t.dtype == torch.float32, name
        elif t.dim() == 1:
            assert t.dtype == torch.bfloat16 and (t.float() - 1).abs().max() < 0.5, name
    assert any(n.endswith("e_score_correction_bias") for n in tensors) == (shape == "tiny-v3")


def greedy(model, prompt: list[int], tokens: int) -> list[int]:
    ids = list(prompt)
    for _ in range(tokens):
        ids.append(int(model.full_logits(torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt) :]


@torch.inference_mode()
@pytest.mark.parametrize("shape,quantization", [("tiny", None), ("tiny-v3", None), ("mid", "w4a8")])
def test_greedy_text_is_not_a_few_tokens_repeated(random_checkpoints, shape, quantization):
    model = load_model(random_checkpoints(shape), dtype="bfloat16", quantization=quantization)
    prompts = [[1, 504, 3458, 314], [1, 2113, 28, 253], [1, 4093, 1370, 42, 9]]
    outputs = [greedy(model, p, 12) for p in prompts]
    assert all(len(set(out)) >= 8 for out in outputs), outputs
    assert len({tuple(out) for out in outputs}) == len(prompts), outputs


@torch.inference_mode()
@pytest.mark.parametrize("shape", ["tiny", "tiny-v3"])
def test_the_folder_matches_transformers(random_checkpoints, shape):
    folder = random_checkpoints(shape)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.randint(0, SHAPES[shape]["vocab_size"], (2, 20), generator=torch.Generator().manual_seed(0))
    ref = hf(ids).logits
    diff = (load_model(folder).full_logits(ids) - ref).abs().max().item()
    assert diff <= 1e-4 * ref.abs().max().item(), f"max abs logit diff {diff:.2e}"


def test_the_command_writes_a_folder_generate_serves(bundled_source, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(random_model, "read_source", lambda: bundled_source)
    out = tmp_path / "tiny-v3"
    assert (
        main(["bench", "random-model", "--shape", "tiny-v3", "--out", str(out), "--seed", "1", "--shard-size", "2MiB"])
        == 0
    )
    assert f"wrote {out}" in capsys.readouterr().out
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (bundled_source.bos_token_id, bundled_source.eos_token_id)
    assert len(weight_files(out)) > 2 and (out / "tokenizer.json").exists()
    card = (out / "README.md").read_text()
    assert "SmolLM2" in card and "not the release's" in card and "--seed 1" in card
    with safe_open(str(weight_files(out)[0]), "pt") as f:
        assert f.metadata() == {"format": "pt"}
    code = main(
        [
            "generate",
            str(out),
            "--prompt",
            "Hello there",
            "--max-tokens",
            "6",
            "--dtype",
            "float32",
            "--kv-cache-memory",
            "4MiB",
            "--max-model-len",
            "256",
            "--quantization",
            "w4a8",
        ]
    )
    assert code == 0 and capsys.readouterr().out.strip()


def test_bad_shape_and_seed_are_refused(bundled_source, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["bench", "random-model", "--shape", "deepseek-v9", "--out", str(tmp_path / "x")])
    assert "invalid choice: 'deepseek-v9'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="seed must be in"):
        random_model.write_random_model("tiny", tmp_path / "x", seed=-1, source=bundled_source)


def test_gguf_twin_is_the_exporter_asked_for_q4_0(tmp_path, monkeypatch):
    """The call the GGUF exporter gets (tests/export checks the file it writes)."""
    calls = []

    def export_gguf(folder, out, outtype="auto"):
        calls.append((folder, out, outtype))
        return out

    monkeypatch.setattr(random_model, "export_gguf", export_gguf)
    folder = tmp_path / "v2lite"
    assert random_model.write_gguf_twin(folder) == tmp_path / "v2lite-Q4_0.gguf"
    assert random_model.write_gguf_twin(folder, tmp_path / "x.gguf") == tmp_path / "x.gguf"
    assert calls == [(folder, tmp_path / "v2lite-Q4_0.gguf", "q4_0"), (folder, tmp_path / "x.gguf", "q4_0")]
