"""KV-cache bytes per token: MLA latent (any cache dtype) against MHA / GQA equivalents."""

from __future__ import annotations

from dataclasses import dataclass

from latentkv.cache.coded import layer_codes
from latentkv.cache.format import cache_format
from latentkv.config import ModelConfig
from latentkv.facts import MODEL_DTYPES, TRANSFORM_CODE


@dataclass
class KVAccount:
    elements_per_token: int  # cached values per token over all layers (scales not counted)
    bytes_per_token: int  # including quantization scales
    mha_elements_per_token: int  # an MHA model of the same shape: 2·H·d_h per layer
    mha_bytes_per_token: int  # MHA at the model dtype

    @property
    def ratio_vs_mha(self) -> float:
        return self.mha_bytes_per_token / self.bytes_per_token

    def tokens_in(self, nbytes: int) -> int:
        return nbytes // self.bytes_per_token


def latent_bytes(ranks: list[int], rope_dim: int, cache_dtype: str = "auto", model_dtype: str = "bfloat16") -> int:
    """Bytes one token occupies in the latent cache over layers of latent widths `ranks`, scales
    included: what its format (cache/format.py) lays out, the sizes LatentCache allocates."""
    fmt = cache_format(cache_dtype, MODEL_DTYPES[model_dtype])
    return sum(fmt.bytes_per_token(rank, rope_dim) for rank in ranks)


def latent_bytes_per_token(cfg: ModelConfig, cache_dtype: str = "auto", model_dtype: str = "bfloat16") -> int:
    """`latent_bytes` of a model: all its layers, per-layer ranks included (a transform code: the bits
    the folder records, each layer's TransformCode.layer_bytes)."""
    if cache_dtype == TRANSFORM_CODE:
        dtype = MODEL_DTYPES[model_dtype]
        return sum(
            cache_format(cache_dtype, dtype, code).bytes_per_token(cfg.kv_rank(i), cfg.qk_rope_head_dim)
            for i, code in enumerate(layer_codes(cfg))
        )
    ranks = [cfg.kv_rank(layer) for layer in range(cfg.num_hidden_layers)]
    return latent_bytes(ranks, cfg.qk_rope_head_dim, cache_dtype, model_dtype)


def gqa_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, model_dtype: str = "bfloat16") -> int:
    """Standard K and V cache: 2 · Hkv · d per layer (MHA when Hkv = H)."""
    return 2 * num_layers * num_kv_heads * head_dim * MODEL_DTYPES[model_dtype].itemsize


def account(cfg: ModelConfig, cache_dtype: str = "auto", model_dtype: str = "bfloat16") -> KVAccount:
    """MLA cache cost of `cfg` against MHA of the same shape (H heads of v_head_dim, as
    the DeepSeek-V2 paper counts it: 2·128·128 = 32768 elements per layer)."""
    elements = sum(cfg.kv_rank(i) + cfg.qk_rope_head_dim for i in range(cfg.num_hidden_layers))
    mha = 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.v_head_dim
    return KVAccount(
        elements_per_token=elements,
        bytes_per_token=latent_bytes_per_token(cfg, cache_dtype, model_dtype),
        mha_elements_per_token=mha,
        mha_bytes_per_token=gqa_bytes_per_token(
            cfg.num_hidden_layers, cfg.num_attention_heads, cfg.v_head_dim, model_dtype
        ),
    )
