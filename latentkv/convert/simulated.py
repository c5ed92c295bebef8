"""A transform-coded latent cache, simulated: measured before any kernel serves it.

The format (convert/transform_code.py) is not served natively yet. To measure what it does to a
model's behaviour, each layer's fresh latent c and rope key k_r (after RoPE) are quantized and
read back (`transform_code.round_trip`) right where the attention would write them to its cache,
in latentkv's own model with an unquantized cache: every reader (prefill and decode alike) then
sees exactly the values the format would give back. SIMULATED: the codes are never stored, the
cache keeps floats, and the speed says nothing about a native kernel's.
"""

from __future__ import annotations


from latentkv.convert import transform_code as tc
from latentkv.eval.chat import ChatModel


def simulate(model, code: tc.TransformCode):
    """Make `model` (an MLAForCausalLM) read every layer's latent and rope key through `code`
    (in place; returns it). The native fused cache write is turned off: it would store k_r before
    the round trip could see it rotated."""
    layers = model.model.layers
    if len(code.latent_bits) != len(layers):
        raise ValueError(f"the cache format has {len(code.latent_bits)} layers, the model {len(layers)}")
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        if len(code.latent_bits[i]) != attn.kv_rank or len(code.rope_bits[i]) != attn.dr:
            raise ValueError(
                f"layer {i}: the cache format codes {len(code.latent_bits[i])} + {len(code.rope_bits[i])} "
                f"directions, the model caches {attn.kv_rank} + {attn.dr}"
            )
        attn.fused = False
        attn.project = _coded_project(attn.project, list(code.latent_bits[i]), list(code.rope_bits[i]), code.group)
    return model


def _coded_project(project, latent_bits: list[int], rope_bits: list[int], group: int):
    def coded(x, rope, rotate_key: bool = True):
        q_nope, q_rope, c, k_r = project(x, rope, rotate_key)
        return q_nope, q_rope, tc.round_trip(c, latent_bits, group), tc.round_trip(k_r, rope_bits, group)

    return coded


def coded_chat_model(model, code: tc.TransformCode, tokenizer, folder: str) -> ChatModel:
    """A ChatModel of `model` whose cache is `code`, simulated (teacher-forced scoring only)."""
    simulate(model, code)
    return ChatModel(
        lambda ids: model.full_logits(ids, cache_dtype="auto"),
        tokenizer,
        "mla (latentkv model, transform-coded cache simulated)",
        folder,
        cache_dtype=tc.KIND,
    )


def folder_code(cfg) -> tc.TransformCode | None:
    """The transform code a folder's config records (latentkv.cache_format), or None."""
    record = cfg.extensions.get("cache_format")
    return None if record is None else tc.TransformCode.from_dict(record, cfg.num_hidden_layers)
