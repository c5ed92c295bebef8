"""Model shapes the benches use, as config.json fields (transformers' DeepseekV2Config /
DeepseekV3Config names): DeepSeek's releases, and the random-weight shapes `latentkv bench
random-model` writes (bench/random_model.py).

DEEPSEEK_V2_LITE is the published DeepSeek-V2-Lite config.json but for what a random checkpoint
cannot keep: the token ids (the folder carries another tokenizer: random_model.py sets them) and
`auto_map` (DeepSeek's remote code; transformers has deepseek_v2 built in). Checked against public
copies of the release's config: huggingface.co/TechxGenus/DeepSeek-V2-Lite-Chat-AWQ, ModelCloud/
DeepSeek-V2-Lite-gptq-4bit and deepseek-ai/DeepSeek-Coder-V2-Lite-Base (the same architecture).
"""

from __future__ import annotations

DEEPSEEK_V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"],
    "model_type": "deepseek_v2",
    "torch_dtype": "bfloat16",
    "vocab_size": 102400,
    "hidden_size": 2048,
    "intermediate_size": 10944,
    "num_hidden_layers": 27,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "n_shared_experts": 2,
    "moe_intermediate_size": 1408,
    "routed_scaling_factor": 1.0,
    "topk_method": "greedy",
    "n_group": 1,
    "topk_group": 1,
    "scoring_func": "softmax",
    "norm_topk_prob": False,
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 0.707,
        "mscale_all_dim": 0.707,
    },
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "initializer_range": 0.02,
    "use_cache": True,
}

# DeepSeek-V3 (671B): the attention shapes `bench memory` tabulates
DEEPSEEK_V3 = dict(
    model_type="deepseek_v3",
    vocab_size=129280,
    hidden_size=7168,
    intermediate_size=18432,
    num_hidden_layers=61,
    num_attention_heads=128,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    q_lora_rank=1536,
)

# the bundled SmolLM2 tokenizer's vocabulary, which random-model folders carry: the small shapes
# take exactly it, so every id they produce decodes
TOKENIZER_VOCAB = 49152

# A V3-style model of ~1.9B parameters (3.7 GB in bf16): V3's attention (q_lora, rank 512 + rope 64,
# heads of 128 + 64), its vocabulary, sigmoid routing with e_score_correction_bias (noaux_tc) over
# 8 groups of 8 experts, and dense first layers
DEEPSEEK_V3_MINI = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "torch_dtype": "bfloat16",
    "vocab_size": 129280,
    "hidden_size": 1024,
    "intermediate_size": 5632,
    "num_hidden_layers": 16,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "q_lora_rank": 768,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "first_k_dense_replace": 2,
    "moe_layer_freq": 1,
    "n_routed_experts": 64,
    "num_experts_per_tok": 6,
    "n_shared_experts": 1,
    "moe_intermediate_size": 512,
    "routed_scaling_factor": 2.5,
    "topk_method": "noaux_tc",
    "n_group": 8,
    "topk_group": 4,
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "attention_bias": False,
    "tie_word_embeddings": False,
}


def small(base: dict, **fields) -> dict:
    """A small shape of `base`'s family, on the bundled tokenizer's vocabulary."""
    return {**base, "vocab_size": TOKENIZER_VOCAB, **fields}


MOE_V2 = dict(first_k_dense_replace=1, topk_method="greedy", n_group=1, topk_group=1)

SHAPES = {
    "deepseek-v2-lite": DEEPSEEK_V2_LITE,
    "deepseek-v3-mini": DEEPSEEK_V3_MINI,
    # ~133M parameters (266 MB in bf16, ~130 MB packed w4a8): the suite's peak-memory test
    "mid": small(
        DEEPSEEK_V2_LITE,
        **MOE_V2,
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        kv_lora_rank=256,
        qk_nope_head_dim=64,
        qk_rope_head_dim=32,
        v_head_dim=64,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_shared_experts=2,
        moe_intermediate_size=384,
    ),
    # unit tests: V2 (softmax, no q_lora) and V3 (q_lora, sigmoid, groups) families, ~7M parameters
    "tiny": small(
        DEEPSEEK_V2_LITE,
        **MOE_V2,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=32,
    ),
    "tiny-v3": small(
        DEEPSEEK_V3_MINI,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=32,
        kv_lora_rank=32,
        qk_nope_head_dim=16,
        qk_rope_head_dim=16,
        v_head_dim=16,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        n_group=4,
        topk_group=2,
    ),
}
