"""A transform-coded latent cache, simulated: measured before any kernel serves it.

The format (cache/transform_code.py) is served by the reference attention backend (cache/coded.py);
this is how its conversion measured it, and the served engine's reference. To measure what it does to a
model's behaviour, each layer's fresh latent c and rope key k_r (after RoPE) are quantized and
read back (`transform_code.round_trip`) right where the attention would write them to its cache,
in latentkv's own model with an unquantized cache: every reader (prefill and decode alike) then
sees exactly the values the format would give back. SIMULATED: the codes are never stored, the
cache keeps floats, and the speed says nothing about a native kernel's. Under autograd (`latentkv heal`
of a coded folder) the read-back is straight-through.
"""

from __future__ import annotations


import torch

from latentkv.cache import transform_code as tc
from latentkv.eval.chat import ChatModel
from latentkv.rope import apply_rope


def simulate(model, code: tc.TransformCode, only: tuple[int, str] | None = None):
    """Make `model` (an MLAForCausalLM) read every layer's latent and rope key through `code`
    (in place; returns it); only=(layer, "latent" or "rope"): that one side alone, the rest exact
    (a probe of one side's sensitivity). The native fused cache write is turned off: it would store k_r
    before the round trip could see it rotated. Simulating again replaces the code read before."""
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
        attn.plain_project = getattr(attn, "plain_project", attn.project)
        latent, rope = list(code.latent_bits[i]), list(code.rope_bits[i])
        if only is not None:
            latent, rope = (
                (latent, None) if only == (i, "latent") else (None, rope) if only == (i, "rope") else (None, None)
            )
        means = None
        if code.latent_mean is not None:
            means = (torch.tensor(code.latent_mean[i]), torch.tensor(code.rope_mean[i]))
        attn.project = _coded_project(attn.plain_project, latent, rope, code.group, means, attn.interleaved)
    model.simulated = True  # its readers keep a float cache (eval: heal/behaviour.py)
    return model


def _coded_project(project, latent_bits, rope_bits, group: int, means=None, interleaved: bool = True):
    """project with its latent and rope key read through their bits (None: exact); means: (latent
    [r], rope key [dr] before RoPE) coded less, the rope key's turned by each token's position."""

    def coded(x, rope, rotate_key: bool = True):
        q_nope, q_rope, c, k_r = project(x, rope, rotate_key)
        c_mean = k_mean = None
        if means is not None:
            c_mean, k_mean = means
            if rotate_key:
                k_mean = apply_rope(k_mean.expand(x.shape[0], 1, -1), *rope, interleaved)[:, 0]
        if latent_bits is not None:
            c = read_back(c, latent_bits, group, c_mean)
        if rope_bits is not None:
            k_r = read_back(k_r, rope_bits, group, k_mean)
        return q_nope, q_rope, c, k_r

    return coded


def read_back(x: torch.Tensor, bits, group: int, mean=None) -> torch.Tensor:
    """x [T, n] as the cache gives it back (transform_code.round_trip, the same bits); under autograd
    straight-through: the gradient of x itself (the rounding's is zero almost everywhere, so a heal
    through the codes would not move what writes them)."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return tc.round_trip(x, bits, group, mean)
    with torch.no_grad(), torch.autocast(x.device.type, enabled=False):  # the codes in float32, as served
        read = tc.round_trip(x.float(), bits, group, mean).to(x.dtype)
    return _StraightThrough.apply(x, read)


class _StraightThrough(torch.autograd.Function):
    """forward(x, read) -> read; backward: the gradient passes to x unchanged."""

    @staticmethod
    def forward(ctx, x, read):
        return read.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad, None


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
