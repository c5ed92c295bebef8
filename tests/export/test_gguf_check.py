"""What llama.cpp's deepseek2 cannot run is refused with a message that says why (and what to do),
before any file is written; what it can run but computes differently is mapped (gguf_metadata)."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from latentkv.config import ModelConfig
from latentkv.export import export_gguf
from latentkv.export.gguf_check import ExportError, refusals
from latentkv.export.gguf_metadata import rope_scaling_keys
from latentkv.rope import attention_factor, softmax_scale

BASE = dict(
    model_type="deepseek_v3",
    vocab_size=320,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=8,
    v_head_dim=12,
)
MOE = dict(
    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1
)
YARN = dict(
    rope_type="yarn",
    factor=40.0,
    original_max_position_embeddings=64,
    beta_fast=32,
    beta_slow=1,
    mscale=0.707,
    mscale_all_dim=0.707,
)


def cfg(**overrides) -> ModelConfig:
    return ModelConfig.from_dict({**BASE, **overrides})


def test_a_plain_deepseek_config_has_no_refusal():
    assert refusals(cfg()) == [] and refusals(cfg(**MOE, n_group=4, topk_group=2)) == []
    assert refusals(cfg(model_type="deepseek_v2", **MOE, rope_scaling=YARN)) == []


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(latentkv={"kv_lora_ranks": [8, 16, 16]}), "per-layer latent ranks .*`latentkv convert --stock`"),
        (dict(latentkv={"rope_inv_freq": [[1.0, 0.5, 0.25, 0.1]] * 3}), "rope frequencies .* --stock"),
        (dict(latentkv={"kv_a_layernorm": False}), "no kv_a_layernorm .* --stock"),
        (dict(attention_bias=True), "attention biases \\(attention_bias: true"),
        (dict(latentkv={"q_bias": True}), "attention biases \\(latentkv.q_bias: true"),
        (
            dict(**MOE, moe_layer_freq=2, num_hidden_layers=4),
            "MoE layers \\[2\\] are not all layers from the first one on",
        ),
        (
            dict(model_type="deepseek_v2", **MOE, topk_method="group_limited_greedy", n_group=4, topk_group=2),
            "'group_limited_greedy' with 2 of 4 groups: llama.cpp ranks expert groups by their two best",
        ),
        (dict(**MOE, n_group=8, topk_group=2), "8 groups of one expert"),
        (dict(**MOE, routed_scaling_factor=0.0), "routed_scaling_factor 0"),
        (
            dict(rope_scaling={**YARN, "beta_fast": 16}),
            "beta_fast 16 / beta_slow 1: llama.cpp's deepseek2 always uses 32 / 1",
        ),
        (dict(rope_scaling={**YARN, "truncate": False}), "truncate: false"),
        (dict(num_hidden_layers=27, q_lora_rank=24), "q_lora_rank with 27 layers"),
    ],
)
def test_what_llama_cpp_cannot_run_is_refused(overrides, message):
    why = refusals(cfg(**overrides))
    assert len(why) == 1 and re.search(message, why[0]), why


def test_a_native_conversion_is_refused_whole_without_writing(tiny_lm, tmp_path):
    src, _, _ = tiny_lm("v2_dense")
    folder = Path(shutil.copytree(src, tmp_path / "native"))
    raw = json.loads((src / "config.json").read_text())
    raw["latentkv"] = {"kv_a_layernorm": False, "kv_lora_ranks": [16, 12, 16]}
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ExportError) as err:
        export_gguf(folder, tmp_path / "m.gguf")
    text = str(err.value)
    assert str(folder) in text and "per-layer latent ranks" in text and "no kv_a_layernorm" in text
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize(
    "scaling",
    [
        YARN,  # DeepSeek-V2's
        {**YARN, "mscale": 1.0, "mscale_all_dim": 1.0},  # DeepSeek-V3's
        {**YARN, "mscale": 1.0, "mscale_all_dim": 0.707},  # a cos / sin factor other than 1
        {**YARN, "mscale": 0.0, "mscale_all_dim": 0.0},  # YaRN's own: cos / sin 1 + 0.1 ln f, plain scale
        {**YARN, "attention_factor": 1.0, "mscale": 0.0, "mscale_all_dim": 0.0},  # nothing but the frequencies
    ],
)
def test_yarn_keys_give_latentkv_scales_by_llama_cpp_formula(scaling):
    """llama.cpp (llama-context.cpp, deepseek2.cpp): cos / sin A·c and scores A²·m² / sqrt(dk), with
    c = 1 and m = 1 + 0.1·L·ln f when yarn_log_multiplier (0.1·L) is set, else c = m = 1 + 0.1·ln f."""
    c = cfg(rope_scaling=scaling)
    keys = rope_scaling_keys(c)
    ln_f = math.log(scaling["factor"])
    A = keys.get("add_rope_scaling_attn_factors", 1.0)
    if "add_rope_scaling_yarn_log_mul" in keys:
        rope, mscale = A, A * (1 + keys["add_rope_scaling_yarn_log_mul"] / 0.1 * 0.1 * ln_f)
    else:
        rope = mscale = A * (1 + 0.1 * ln_f)
    assert rope == pytest.approx(attention_factor(c.rope_scaling), rel=1e-6)
    assert mscale**2 == pytest.approx(softmax_scale(c) * math.sqrt(c.qk_head_dim), rel=1e-6)
    assert keys["add_rope_scaling_factor"] == scaling["factor"]


def test_a_scale_without_yarn_that_llama_cpp_cannot_give_is_refused():
    odd = cfg(rope_scaling={**YARN, "factor": 1.0, "attention_factor": 1.2})
    with pytest.raises(ExportError, match="no llama.cpp equivalent without YaRN"):
        rope_scaling_keys(odd)
    assert rope_scaling_keys(cfg()) == {}
