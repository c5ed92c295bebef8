"""One decoder layer described once, from the config: the shapes, options and constants that
model/mla.py and model/deepseek.py build the layer's modules from, and that the decode plan
(model/decode_plan.py) hands the native step (kernels/csrc/decode_ops/decode_step.cpp). Each layer
keeps the spec it was built from (`DecoderLayer.spec`), so the two paths read one description
instead of the plan re-deriving it from the modules."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from ..rope import attention_factor, softmax_scale

# DeepSeek's code and transformers build the q_a / kv_a norms with their default eps,
# not the config's rms_norm_eps.
LATENT_NORM_EPS = 1e-6


@dataclass(frozen=True)
class LayerSpec:
    index: int
    hidden: int
    n_heads: int
    dn: int  # per head: the query / key part without rope
    dr: int  # the rope part (one key shared by all heads)
    dv: int  # the value
    kv_rank: int  # the latent c's width (per layer in converted models)
    q_lora_rank: int  # 0: q_proj; else q_a_proj -> q_a_layernorm -> q_b_proj
    q_bias: bool  # q_proj has a bias (Qwen2 sources)
    attention_bias: bool  # q_a_proj, kv_a_proj_with_mqa, o_proj have biases (transformers' meaning)
    kv_a_layernorm: bool  # False: c is used as projected (converted models)
    interleaved: bool  # rope pairs (x0, x1), ... rather than halves
    scale: float  # the softmax scale (YaRN's mscale² included)
    rope_factor: float  # YaRN's factor on cos / sin
    moe: bool  # the MLP is a mixture of experts (the config builds it)
    intermediate: int  # the dense MLP's width
    norm_eps: float  # the decoder's RMSNorms
    latent_eps: float = LATENT_NORM_EPS  # the q_a / kv_a norms

    @property
    def qk_dim(self) -> int:
        return self.n_heads * (self.dn + self.dr)

    @property
    def qkv_a_parts(self) -> list[tuple[str, int, bool]]:
        """The packed projection's parts (checkpoint name, rows, bias): q (or q_a) and [c ; k_r]
        read the same x, so they are one matmul (model/packed.py)."""
        q_part = (
            ("q_a_proj", self.q_lora_rank, self.attention_bias)
            if self.q_lora_rank
            else ("q_proj", self.qk_dim, self.q_bias)
        )
        return [q_part, ("kv_a_proj_with_mqa", self.kv_rank + self.dr, self.attention_bias)]

    @property
    def q_dim(self) -> int:
        """The q part's rows of the packed projection's output."""
        return self.qkv_a_parts[0][1]


def layer_spec(cfg: ModelConfig, layer: int) -> LayerSpec:
    return LayerSpec(
        index=layer,
        hidden=cfg.hidden_size,
        n_heads=cfg.num_attention_heads,
        dn=cfg.qk_nope_head_dim,
        dr=cfg.qk_rope_head_dim,
        dv=cfg.v_head_dim,
        kv_rank=cfg.kv_rank(layer),
        q_lora_rank=cfg.q_lora_rank or 0,
        q_bias=cfg.q_bias,
        attention_bias=cfg.attention_bias,
        kv_a_layernorm=cfg.kv_a_layernorm,
        interleaved=cfg.rope_interleave,
        scale=softmax_scale(cfg),
        rope_factor=attention_factor(cfg.rope_scaling),
        moe=cfg.is_moe_layer(layer),
        intermediate=cfg.intermediate_size,
        norm_eps=cfg.rms_norm_eps,
    )
