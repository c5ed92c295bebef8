import pytest

from latentkv.cache.accounting import account, gqa_bytes_per_token, latent_bytes_per_token
from latentkv.cache.latent_cache import allocate_caches
from latentkv.config import ModelConfig
from latentkv.facts import CACHE_DTYPES, MODEL_DTYPES

V2_LITE = dict(
    model_type="deepseek_v2",
    vocab_size=102400,
    hidden_size=2048,
    intermediate_size=10944,
    num_hidden_layers=27,
    num_attention_heads=16,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
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


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES)
@pytest.mark.parametrize("model_dtype", ["float32", "bfloat16"])
def test_the_formula_is_what_the_caches_allocate(cache_dtype, model_dtype):
    """Bytes per token by the formula (what `convert --kv-bytes` budgets with) == the bytes the
    engine's caches hold per slot, every cache dtype, per-layer ranks."""
    cfg = ModelConfig.from_dict(
        {**V2_LITE, "num_hidden_layers": 3, "qk_rope_head_dim": 48, "latentkv": {"kv_lora_ranks": [96, 160, 32]}}
    )
    caches = allocate_caches(cfg, 2, 16, MODEL_DTYPES[model_dtype], cache_dtype)
    assert sum(c.nbytes() for c in caches) == 2 * 16 * latent_bytes_per_token(cfg, cache_dtype, model_dtype)


def test_an_8_bit_rope_key_costs_a_byte_and_a_scale():
    cfg = ModelConfig.from_dict(V2_LITE)
    assert latent_bytes_per_token(cfg, "int8_rope8") == 27 * (512 + 4 + 64 + 4)
