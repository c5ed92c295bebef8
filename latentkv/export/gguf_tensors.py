"""A DeepSeek-V2/V3 checkpoint's tensors in llama.cpp's deepseek2 layout, and the type each is
stored as.

The layout (src/models/deepseek2.cpp load_arch_tensors; names from gguf.constants):
- kv_b_proj [H·(dn+dv), r] is split per head into attn_k_b [H, r, dn] (transposed: the absorbed
  query is W_UKᵀ q_nope) and attn_v_b [H, dv, r], as convert_hf_to_gguf does;
- routed experts are stacked per layer into ffn_{gate,up,down}_exps [E, ...], the router is
  ffn_gate_inp and V3's score correction exp_probs_b.bias;
- the rows feeding the q_a / kv_a norms are scaled by gguf_metadata.latent_scale (llama.cpp's norm
  eps), and checkpoints that keep rope dims as halves (`rope_interleave: false`) get their rope
  rows interleaved: llama.cpp rotates adjacent pairs (its NORM rope type), as DeepSeek does.
The same functions run on meta tensors to plan the file's header and on the weights to write it.
"""

from __future__ import annotations

from typing import Callable, Iterator

import gguf
import numpy as np
import torch

from latentkv.config import ModelConfig
from latentkv.export.gguf_metadata import latent_scale
from latentkv.model.spec import layer_spec

T = gguf.MODEL_TENSOR
Q = gguf.GGMLQuantizationType
OUTTYPES = {"f32": Q.F32, "f16": Q.F16, "bf16": Q.BF16, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_1": Q.Q4_1}
FILE_TYPES = {
    Q.F32: gguf.LlamaFileType.ALL_F32,
    Q.F16: gguf.LlamaFileType.MOSTLY_F16,
    Q.BF16: gguf.LlamaFileType.MOSTLY_BF16,
    Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0,
    Q.Q4_0: gguf.LlamaFileType.MOSTLY_Q4_0,
    Q.Q4_1: gguf.LlamaFileType.MOSTLY_Q4_1,
}
QUANTIZED = (Q.Q8_0, Q.Q4_0, Q.Q4_1)
# kept in float32 whatever the outtype: routing decisions are precision-sensitive (latentkv keeps the
# router float32 too), and llama.cpp never quantizes it
FLOAT32 = (T.FFN_GATE_INP, T.FFN_EXP_PROBS_B)
# never quantized (llama.cpp's quantize skips them for MLA models: per-head matrices read whole)
UNQUANTIZED = (T.ATTN_K_B, T.ATTN_V_B)

Getter = Callable[[str], torch.Tensor]


def gguf_name(kind: T, layer: int | None = None) -> str:
    suffix = "bias" if kind == T.FFN_EXP_PROBS_B else "weight"
    return f"{gguf.TENSOR_NAMES[kind].format(bid=layer)}.{suffix}"


def model_tensors(
    cfg: ModelConfig, top: Getter, layer: Callable[[int], Getter]
) -> Iterator[tuple[str, T, torch.Tensor]]:
    """(GGUF name, kind, tensor) of every tensor of the file, in file order; `top(name)` gives a
    checkpoint tensor outside the layers, `layer(i)` a getter of layer i's (called once per layer)."""
    yield gguf_name(T.TOKEN_EMBD), T.TOKEN_EMBD, top("model.embed_tokens.weight")
    for i in range(cfg.num_hidden_layers):
        for kind, tensor in layer_tensors(cfg, i, layer(i)):
            yield gguf_name(kind, i), kind, tensor
    yield gguf_name(T.OUTPUT_NORM), T.OUTPUT_NORM, top("model.norm.weight")
    if not cfg.tie_word_embeddings:  # tied: llama.cpp's deepseek2 reads token_embd as the output
        yield gguf_name(T.OUTPUT), T.OUTPUT, top("lm_head.weight")


def layer_tensors(cfg: ModelConfig, i: int, get: Getter) -> Iterator[tuple[T, torch.Tensor]]:
    spec = layer_spec(cfg, i)
    p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
    H, dn, dr, dv, r = spec.n_heads, spec.dn, spec.dr, spec.dv, spec.kv_rank
    scale = latent_scale(cfg)
    yield T.ATTN_NORM, get(p + "input_layernorm.weight")
    if spec.q_lora_rank:
        yield T.ATTN_Q_A, scaled(get(a + "q_a_proj.weight"), scale)
        yield T.ATTN_Q_A_NORM, get(a + "q_a_layernorm.weight")
        yield T.ATTN_Q_B, query_rope_rows(get(a + "q_b_proj.weight"), H, dn, dr, spec.interleaved)
    else:
        yield T.ATTN_Q, query_rope_rows(get(a + "q_proj.weight"), H, dn, dr, spec.interleaved)
    kv_a = get(a + "kv_a_proj_with_mqa.weight")  # [c ; k_r]
    if scale != 1 or not spec.interleaved:
        kv_a = torch.cat([scaled(kv_a[:r], scale), interleave_rows(kv_a[r:], spec.interleaved)])
    yield T.ATTN_KV_A_MQA, kv_a
    yield T.ATTN_KV_A_NORM, get(a + "kv_a_layernorm.weight")
    k_b, v_b = get(a + "kv_b_proj.weight").view(H, dn + dv, r).split([dn, dv], dim=1)
    yield T.ATTN_K_B, k_b.transpose(1, 2)
    yield T.ATTN_V_B, v_b
    yield T.ATTN_OUT, get(a + "o_proj.weight")
    yield T.FFN_NORM, get(p + "post_attention_layernorm.weight")
    if spec.moe:
        yield from moe_tensors(cfg, p + "mlp.", get)
    else:
        for kind, part in ((T.FFN_GATE, "gate_proj"), (T.FFN_UP, "up_proj"), (T.FFN_DOWN, "down_proj")):
            yield kind, get(f"{p}mlp.{part}.weight")


def moe_tensors(cfg: ModelConfig, p: str, get: Getter) -> Iterator[tuple[T, torch.Tensor]]:
    yield T.FFN_GATE_INP, get(p + "gate.weight")
    if cfg.topk_method == "noaux_tc":
        yield T.FFN_EXP_PROBS_B, get(p + "gate.e_score_correction_bias")
    for kind, part in ((T.FFN_GATE_EXP, "gate_proj"), (T.FFN_UP_EXP, "up_proj"), (T.FFN_DOWN_EXP, "down_proj")):
        yield kind, torch.stack([get(f"{p}experts.{e}.{part}.weight") for e in range(cfg.n_routed_experts)])
    shared = ((T.FFN_GATE_SHEXP, "gate_proj"), (T.FFN_UP_SHEXP, "up_proj"), (T.FFN_DOWN_SHEXP, "down_proj"))
    for kind, part in shared:
        if cfg.n_shared_experts:
            yield kind, get(f"{p}shared_experts.{part}.weight")
        else:  # llama.cpp always adds a shared expert: one with zero weights adds exactly 0
            like = get(f"{p}experts.0.{part}.weight")
            yield kind, torch.zeros(like.shape, dtype=like.dtype, device=like.device)


def scaled(w: torch.Tensor, scale: float) -> torch.Tensor:
    return w if scale == 1 else w.float() * scale


def interleave_rows(w: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Rope rows [dr, ...] as halves (x_i, x_{i+dr/2}) -> adjacent pairs (x_2i, x_2i+1)."""
    if interleaved:
        return w
    half = w.shape[0] // 2
    return w.view(2, half, *w.shape[1:]).transpose(0, 1).reshape(w.shape)


def query_rope_rows(w: torch.Tensor, H: int, dn: int, dr: int, interleaved: bool) -> torch.Tensor:
    """q rows [H·(dn+dr), in]: each head's rope rows interleaved (see interleave_rows)."""
    if interleaved:
        return w
    heads = w.view(H, dn + dr, -1)
    rope = torch.stack([interleave_rows(h[dn:], False) for h in heads])
    return torch.cat([heads[:, :dn], rope], dim=1).reshape(w.shape)


def tensor_type(kind: T, shape: tuple[int, ...], outtype: Q) -> Q:
    """What a tensor is stored as: 1-D ones and the router in float32 (as convert_hf_to_gguf), the
    others in `outtype`; under a quantized outtype, attn_k_b / attn_v_b and tensors whose rows are
    not whole blocks in float16 (convert_hf_to_gguf's fallback)."""
    if len(shape) == 1 or kind in FLOAT32:
        return Q.F32
    if outtype in QUANTIZED and (kind in UNQUANTIZED or shape[-1] % gguf.GGML_QUANT_SIZES[outtype][0]):
        return Q.F16
    return outtype


def byte_shape(shape: tuple[int, ...], qtype: Q) -> tuple[int, ...]:
    return tuple(gguf.quants.quant_shape_to_byte_shape(shape, qtype))


def encode(tensor: torch.Tensor, qtype: Q) -> np.ndarray:
    """The tensor's bytes in `qtype`, as GGUFWriter.write_tensor_data takes them: float32 / float16
    arrays, else uint8 [..., row bytes]. Casts are torch's (round to nearest even, as gguf.quants);
    quantization is gguf.quants' (llama.cpp's reference quantizers), one leading slice at a time."""
    if qtype == Q.F32:
        return tensor.to(torch.float32).contiguous().numpy()
    if qtype == Q.F16:
        return tensor.to(torch.float16).contiguous().numpy()
    if qtype == Q.BF16:
        return tensor.to(torch.bfloat16).contiguous().view(torch.int16).numpy().view(np.uint8)
    if tensor.dim() > 2:
        return np.stack([encode(t, qtype) for t in tensor])
    return gguf.quants.quantize(tensor.to(torch.float32).contiguous().numpy(), qtype)
