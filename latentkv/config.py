"""Model settings read from a checkpoint's config.json, validated with clear messages.

Field names follow transformers' DeepseekV2Config / DeepseekV3Config; the optional
`latentkv` block carries the native extensions of converted models
(docs/internals.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from latentkv.facts import CACHE_DTYPES, TRANSFORM_CODE, UNQUANTIZED_CACHES


def _kind(record) -> str:
    return str(record.get("kind", "unknown") if isinstance(record, dict) else record)


class ConfigError(ValueError):
    """A config that cannot describe a model we can run; the message names the field."""


@dataclass
class RopeScaling:
    """YaRN parameters (DeepSeek-V2/V3 style). `factor == 1` means plain RoPE."""

    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class DeepseekLayout:
    """What a config.json with DeepSeek's field names (transformers' DeepseekV2Config /
    DeepseekV3Config) leaves to its model_type: the defaults of the router fields it may omit,
    whether it reads rope_interleave, and whether one chosen expert's weight is normalized."""

    topk_method: str = "greedy"
    scoring_func: str = "softmax"
    norm_topk_prob: bool = False
    reads_rope_interleave: bool = False  # V2's rope pairs are always interleaved
    normalizes_one_expert: bool = False  # V2 divides by the chosen weights' sum only when it chose more than one


DEEPSEEK_V2 = DeepseekLayout()
DEEPSEEK_V3 = DeepseekLayout(
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    reads_rope_interleave=True,
    normalizes_one_expert=True,
)
# model_type -> its layout, for ModelConfig.from_dict (model/families.py registers each with its modules)
DEEPSEEK_LAYOUTS = {"deepseek_v2": DEEPSEEK_V2, "deepseek_v3": DEEPSEEK_V3}


@dataclass
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = field(default_factory=RopeScaling)
    rope_interleave: bool = True
    # MoE
    n_routed_experts: int | None = None
    n_shared_experts: int = 0
    num_experts_per_tok: int = 1
    moe_intermediate_size: int = 0
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    n_group: int = 1
    topk_group: int = 1
    topk_method: str = "greedy"
    scoring_func: str = "softmax"
    norm_topk_prob: bool = False
    routed_scaling_factor: float = 1.0
    normalizes_one_expert: bool = False  # norm_topk_prob applies to a single chosen expert too (DeepseekLayout)
    # tokens
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # latentkv extensions (native converted checkpoints)
    kv_a_layernorm: bool = True
    kv_lora_ranks: list[int] | None = None
    rope_inv_freq: list[list[float]] | None = None
    q_bias: bool = False
    cache_dtype: str | None = None  # the cache the folder is served with when none is asked (convert --kv-bytes)
    extensions: dict = field(default_factory=dict)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def served_cache_dtype(self, asked: str) -> str:
        """The cache a request for `asked` gets: "auto" is the folder's own format where it records
        one (`convert` records it), else "auto" (the model dtype); "bfloat16" / "float32" are
        "auto" whatever the folder records (the engine checks the name is the model dtype). A folder
        that records a transform code (latentkv.cache_format) is served in it (facts.TRANSFORM_CODE)
        and in nothing else: any cache asked by name is refused, naming the folder's."""
        if "cache_format" in self.extensions:
            kind = _kind(self.extensions["cache_format"])
            if kind != TRANSFORM_CODE:
                raise ConfigError(f"latentkv.cache_format: unknown kind {kind!r} (expected {TRANSFORM_CODE!r})")
            if asked not in ("auto", TRANSFORM_CODE):
                raise ConfigError(
                    f"kv_cache_dtype {asked!r}: this folder's cache is a transform code (bits per latent "
                    "direction, convert --kv-bytes), the one format it is served in; leave kv_cache_dtype 'auto'"
                )
            return TRANSFORM_CODE
        if asked == TRANSFORM_CODE:
            raise ConfigError(
                f"kv_cache_dtype {TRANSFORM_CODE!r}: this folder records no transform code (latentkv.cache_format: "
                "convert --kv-bytes writes one)"
            )
        if asked in UNQUANTIZED_CACHES:
            return "auto"
        return self.cache_dtype if asked == "auto" and self.cache_dtype else asked

    def kv_rank(self, layer: int) -> int:
        """Latent width of one layer (per-layer ranks come from native checkpoints)."""
        return self.kv_lora_ranks[layer] if self.kv_lora_ranks else self.kv_lora_rank

    def is_moe_layer(self, layer: int) -> bool:
        return bool(self.n_routed_experts) and layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    @property
    def limits_groups(self) -> bool:
        """The router keeps only the experts of the best `topk_group` of `n_group` groups."""
        return self.topk_method != "greedy" and self.n_group > 1

    @property
    def normalizes_topk(self) -> bool:
        """The chosen experts' weights are divided by their sum (V2 only when more than one is chosen)."""
        return self.norm_topk_prob and (self.normalizes_one_expert or self.num_experts_per_tok > 1)

    @property
    def eos_token_ids(self) -> list[int]:
        if self.eos_token_id is None:
            return []
        return list(self.eos_token_id) if isinstance(self.eos_token_id, (list, tuple)) else [self.eos_token_id]

    @classmethod
    def from_dict(cls, raw: dict) -> "ModelConfig":
        """A config.json of one of DEEPSEEK_LAYOUTS' model types (model/families.py `read_config`
        reads any registered family's)."""
        model_type = raw.get("model_type")
        if model_type not in DEEPSEEK_LAYOUTS:
            raise unknown_model_type(model_type, DEEPSEEK_LAYOUTS)
        return cls.read_deepseek(raw, DEEPSEEK_LAYOUTS[model_type])

    @classmethod
    def read_deepseek(cls, raw: dict, layout: DeepseekLayout) -> "ModelConfig":
        """config.json's DeepSeek fields (and the `latentkv` extensions), with `layout`'s defaults."""
        ext = raw.get("latentkv") or {}
        rope_theta, scaling = _read_rope(raw)
        cfg = cls(
            model_type=raw["model_type"],
            vocab_size=_req(raw, "vocab_size"),
            hidden_size=_req(raw, "hidden_size"),
            intermediate_size=_req(raw, "intermediate_size"),
            num_hidden_layers=_req(raw, "num_hidden_layers"),
            num_attention_heads=_req(raw, "num_attention_heads"),
            kv_lora_rank=_req(raw, "kv_lora_rank"),
            qk_nope_head_dim=_req(raw, "qk_nope_head_dim"),
            qk_rope_head_dim=_req(raw, "qk_rope_head_dim"),
            v_head_dim=_req(raw, "v_head_dim"),
            q_lora_rank=raw.get("q_lora_rank"),
            rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
            max_position_embeddings=raw.get("max_position_embeddings", 4096),
            tie_word_embeddings=raw.get("tie_word_embeddings", False),
            attention_bias=raw.get("attention_bias", False),
            hidden_act=raw.get("hidden_act", "silu"),
            rope_theta=rope_theta,
            rope_scaling=scaling,
            rope_interleave=raw.get("rope_interleave", True) if layout.reads_rope_interleave else True,
            n_routed_experts=raw.get("n_routed_experts"),
            n_shared_experts=raw.get("n_shared_experts") or 0,
            num_experts_per_tok=raw.get("num_experts_per_tok") or 1,
            moe_intermediate_size=raw.get("moe_intermediate_size") or 0,
            first_k_dense_replace=raw.get("first_k_dense_replace", 0),
            moe_layer_freq=raw.get("moe_layer_freq", 1),
            n_group=raw.get("n_group") or 1,
            topk_group=raw.get("topk_group") or 1,
            topk_method=raw.get("topk_method") or layout.topk_method,
            scoring_func=raw.get("scoring_func") or layout.scoring_func,
            norm_topk_prob=raw.get("norm_topk_prob", layout.norm_topk_prob),
            routed_scaling_factor=raw.get("routed_scaling_factor", 1.0),
            normalizes_one_expert=layout.normalizes_one_expert,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_id=raw.get("eos_token_id"),
            kv_a_layernorm=ext.get("kv_a_layernorm", True),
            kv_lora_ranks=ext.get("kv_lora_ranks"),
            rope_inv_freq=ext.get("rope_inv_freq"),
            q_bias=ext.get("q_bias", False),
            cache_dtype=ext.get("cache_dtype"),
            extensions=ext,
        )
        cfg.validate()
        return cfg

    @classmethod
    def from_file(cls, path: str | Path, read: Callable[[dict], "ModelConfig"] | None = None) -> "ModelConfig":
        """config.json at `path` through `read` (default from_dict); errors name the file."""
        path = Path(path)
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ConfigError(f"{path}: not valid JSON ({err})") from err
        except OSError as err:
            raise ConfigError(f"{path}: cannot read it ({err})") from err
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a JSON object, got {type(raw).__name__}")
        try:
            return (read or cls.from_dict)(raw)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from err
        except (TypeError, ValueError, AttributeError, KeyError) as err:  # a field of an unexpected shape
            raise ConfigError(f"{path}: cannot read the model config ({type(err).__name__}: {err})") from err

    def validate(self) -> None:
        check_field_types(self)
        positive = [
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "kv_lora_rank",
            "v_head_dim",
        ]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.qk_rope_head_dim % 2:
            raise ConfigError(f"qk_rope_head_dim must be even (RoPE rotates pairs), got {self.qk_rope_head_dim}")
        if self.qk_nope_head_dim + self.qk_rope_head_dim <= 0:
            raise ConfigError("qk_nope_head_dim + qk_rope_head_dim must be positive")
        if self.hidden_act != "silu":
            raise ConfigError(f"hidden_act {self.hidden_act!r} is not supported; expected 'silu'")
        if self.kv_lora_ranks is not None and len(self.kv_lora_ranks) != self.num_hidden_layers:
            raise ConfigError(
                f"latentkv.kv_lora_ranks has {len(self.kv_lora_ranks)} entries; "
                f"expected num_hidden_layers={self.num_hidden_layers}"
            )
        if self.cache_dtype is not None and self.cache_dtype not in CACHE_DTYPES:
            raise ConfigError(f"latentkv.cache_dtype must be one of {list(CACHE_DTYPES)}, got {self.cache_dtype!r}")
        if self.rope_inv_freq is not None:
            if len(self.rope_inv_freq) != self.num_hidden_layers:
                raise ConfigError(f"latentkv.rope_inv_freq needs one list per layer ({self.num_hidden_layers})")
            bad = [i for i, f in enumerate(self.rope_inv_freq) if len(f) != self.qk_rope_head_dim // 2]
            if bad:
                raise ConfigError(
                    f"latentkv.rope_inv_freq[{bad[0]}] must have qk_rope_head_dim/2 = "
                    f"{self.qk_rope_head_dim // 2} entries"
                )
        if any(self.is_moe_layer(i) for i in range(self.num_hidden_layers)):
            self._validate_moe()  # MoE settings of an all-dense model are inert

    def _validate_moe(self) -> None:
        if self.moe_intermediate_size <= 0:
            raise ConfigError("moe_intermediate_size must be positive when n_routed_experts is set")
        if not 1 <= self.num_experts_per_tok <= self.n_routed_experts:
            raise ConfigError(f"num_experts_per_tok must be in 1..n_routed_experts ({self.n_routed_experts})")
        if self.n_routed_experts % self.n_group:
            raise ConfigError(
                f"n_routed_experts ({self.n_routed_experts}) must be divisible by n_group ({self.n_group})"
            )
        if not 1 <= self.topk_group <= self.n_group:
            raise ConfigError(f"topk_group must be in 1..n_group ({self.n_group}), got {self.topk_group}")
        methods = ("greedy", "group_limited_greedy", "noaux_tc")
        if self.topk_method not in methods:
            raise ConfigError(f"topk_method {self.topk_method!r} is not supported; expected one of {methods}")
        if self.scoring_func not in ("softmax", "sigmoid"):
            raise ConfigError(f"scoring_func {self.scoring_func!r} is not supported; expected 'softmax' or 'sigmoid'")


INT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "max_position_embeddings",
    "n_shared_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "first_k_dense_replace",
    "moe_layer_freq",
    "n_group",
    "topk_group",
)
OPTIONAL_INT_FIELDS = ("q_lora_rank", "n_routed_experts")
FLOAT_FIELDS = ("rms_norm_eps", "rope_theta", "routed_scaling_factor")
BOOL_FIELDS = ("tie_word_embeddings", "attention_bias")


def check_field_types(cfg: "ModelConfig") -> None:
    """A field of the wrong JSON type (e.g. "kv_lora_rank": "512") is named, not a TypeError later."""

    def wrong(name: str, expected: str):
        value = getattr(cfg, name)
        raise ConfigError(f"{name} must be {expected}, got {value!r} ({type(value).__name__})")

    for name in INT_FIELDS + OPTIONAL_INT_FIELDS:
        value = getattr(cfg, name)
        if (value is not None or name in INT_FIELDS) and (isinstance(value, bool) or not isinstance(value, int)):
            wrong(name, "an integer")
    for name in FLOAT_FIELDS:
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            wrong(name, "a number")
    for name in BOOL_FIELDS:
        if not isinstance(getattr(cfg, name), bool):
            wrong(name, "true or false")
    ranks = cfg.kv_lora_ranks
    if ranks is not None and not (isinstance(ranks, list) and all(type(r) is int for r in ranks)):
        raise ConfigError(f"latentkv.kv_lora_ranks must be a list of integers, got {ranks!r}")


def unknown_model_type(model_type, known) -> ConfigError:
    """The error for a config.json whose model_type no reader knows; it names the known ones."""
    return ConfigError(
        f"config.json: model_type {model_type!r} is not supported; expected one of {sorted(known)} "
        "(convert Llama-family models with `latentkv convert`)"
    )


def _req(raw: dict, key: str):
    if raw.get(key) is None:
        raise ConfigError(f"missing required field {key!r}")
    return raw[key]


def _read_rope(raw: dict) -> tuple[float, RopeScaling]:
    """Read rope_theta and YaRN settings from either transformers-5 `rope_parameters`
    or the older `rope_theta` + `rope_scaling` pair that DeepSeek's checkpoints use."""
    params = dict(raw.get("rope_parameters") or {})
    legacy = raw.get("rope_scaling") or {}
    params = {**legacy, **params}
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = params.get("rope_type", params.get("type", "default")) or "default"
    if rope_type == "default":
        return theta, RopeScaling()
    if rope_type != "yarn":
        raise ConfigError(f"rope type {rope_type!r} is not supported; expected 'default' or 'yarn'")
    original = params.get("original_max_position_embeddings", 4096)
    factor = params.get("factor") or raw.get("max_position_embeddings", original) / original
    return theta, RopeScaling(
        rope_type="yarn",
        factor=float(factor),
        original_max_position_embeddings=original,
        beta_fast=params.get("beta_fast") or 32.0,
        beta_slow=params.get("beta_slow") or 1.0,
        mscale=params.get("mscale") or 0.0,
        mscale_all_dim=params.get("mscale_all_dim") or 0.0,
        attention_factor=params.get("attention_factor"),
        truncate=params.get("truncate", True),
    )
