from latentkv.cache.accounting import account, gqa_bytes_per_token, latent_bytes_per_token
from latentkv.config import ModelConfig

V2_LITE = dict(
    model_type="deepseek_v2", vocab_size=102400, hidden_size=2048, intermediate_size=10944, num_hidden_layers=27,
    num_attention_heads=16, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
)


def test_deepseek_v2_lite_bytes_per_token():
    cfg = ModelConfig.from_dict(V2_LITE)
    acc = account(cfg, "auto", "bfloat16")
    assert acc.elements_per_token == 27 * 576
    assert acc.bytes_per_token == 27 * 576 * 2
    assert acc.mha_elements_per_token == 27 * 2 * 16 * 128
    # int8 latent: 512 one-byte codes + a float32 scale + 64 bf16 rope values per layer
    assert latent_bytes_per_token(cfg, "int8") == 27 * (512 + 4 + 128)
    assert latent_bytes_per_token(cfg, "fp8_e4m3") == latent_bytes_per_token(cfg, "int8")


def test_per_layer_ranks_are_summed():
    cfg = ModelConfig.from_dict({**V2_LITE, "num_hidden_layers": 2, "latentkv": {"kv_lora_ranks": [100, 200]}})
    assert latent_bytes_per_token(cfg, "auto", "float32") == 4 * (100 + 64 + 200 + 64)


def test_gqa_bytes():
    assert gqa_bytes_per_token(30, 3, 64, "bfloat16") == 2 * 30 * 3 * 64 * 2
