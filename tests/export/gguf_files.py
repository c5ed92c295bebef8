"""What the GGUF export tests build, read back and compare against: tiny DeepSeek folders with a given
tokenizer, a GGUF file's tensors (dequantized, in PyTorch's [out, in] order) and metadata through
gguf.GGUFReader, and the llama.cpp layout of a folder's safetensors restated plainly (the export's
own code is not used to check itself)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from tiny import BASE

# the tiny configs (tests/tiny.py) llama.cpp can run; v2_moe_group_limited is refused (test_gguf_check.py)
EXPORTABLE = ["v2_dense", "v3_dense_qlora", "v3_moe_sigmoid", "v2_yarn", "v3_yarn_halves_tied"]


def read_gguf(path: Path) -> tuple[dict[str, object], dict[str, tuple[str, np.ndarray]]]:
    """(metadata key -> value, tensor name -> (type name, float32 values in numpy's reversed order))."""
    reader = gguf.GGUFReader(str(path))
    fields = {key: field.contents() for key, field in reader.fields.items()}
    tensors = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        tensors[t.name] = (t.tensor_type.name, values.reshape(tuple(int(n) for n in reversed(t.shape))))
    return fields, tensors


def halves_to_pairs(rows: torch.Tensor) -> torch.Tensor:
    """[dr, ...] rope rows as halves (i, i + dr/2) -> adjacent pairs."""
    dr = rows.shape[0]
    order = [j for i in range(dr // 2) for j in (i, i + dr // 2)]
    return rows[order]


def expected_tensors(folder: Path) -> dict[str, np.ndarray]:
    """The float32 values llama.cpp's deepseek2 should read from the export of `folder` (one
    safetensors file, per-expert names, as transformers saves the tiny models)."""
    cfg = json.loads((folder / "config.json").read_text())
    sd = {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}
    H, dn, dr, dv, r = (
        cfg[k] for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "kv_lora_rank")
    )
    pairs = cfg.get("rope_interleave", True) or cfg["model_type"] == "deepseek_v2"
    scale = math.sqrt(cfg.get("rms_norm_eps", 1e-6) / 1e-6)  # llama.cpp's latent norms use rms_norm_eps
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    if not cfg.get("tie_word_embeddings"):
        out["output.weight"] = sd["lm_head.weight"]

    def query(w):
        heads = w.view(H, dn + dr, -1)
        rope = heads[:, dn:] if pairs else torch.stack([halves_to_pairs(h[dn:]) for h in heads])
        return torch.cat([heads[:, :dn], rope], 1).reshape(w.shape)

    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        a = p + "self_attn."
        out[b + "attn_norm.weight"] = sd[p + "input_layernorm.weight"]
        out[b + "ffn_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
        if cfg.get("q_lora_rank"):
            out[b + "attn_q_a.weight"] = sd[a + "q_a_proj.weight"] * scale
            out[b + "attn_q_a_norm.weight"] = sd[a + "q_a_layernorm.weight"]
            out[b + "attn_q_b.weight"] = query(sd[a + "q_b_proj.weight"])
        else:
            out[b + "attn_q.weight"] = query(sd[a + "q_proj.weight"])
        kv_a = sd[a + "kv_a_proj_with_mqa.weight"]
        out[b + "attn_kv_a_mqa.weight"] = torch.cat(
            [kv_a[:r] * scale, kv_a[r:] if pairs else halves_to_pairs(kv_a[r:])]
        )
        out[b + "attn_kv_a_norm.weight"] = sd[a + "kv_a_layernorm.weight"]
        kv_b = sd[a + "kv_b_proj.weight"].view(H, dn + dv, r)
        out[b + "attn_k_b.weight"] = kv_b[:, :dn].transpose(1, 2)
        out[b + "attn_v_b.weight"] = kv_b[:, dn:]
        out[b + "attn_output.weight"] = sd[a + "o_proj.weight"]
        if i < cfg.get("first_k_dense_replace", 0) or not cfg.get("n_routed_experts"):
            for ours, theirs in (("ffn_gate", "gate_proj"), ("ffn_up", "up_proj"), ("ffn_down", "down_proj")):
                out[f"{b}{ours}.weight"] = sd[f"{p}mlp.{theirs}.weight"]
            continue
        out[b + "ffn_gate_inp.weight"] = sd[p + "mlp.gate.weight"]
        if p + "mlp.gate.e_score_correction_bias" in sd:
            out[b + "exp_probs_b.bias"] = sd[p + "mlp.gate.e_score_correction_bias"]
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            out[f"{b}ffn_{ours}_exps.weight"] = torch.stack(
                [sd[f"{p}mlp.experts.{e}.{theirs}.weight"] for e in range(cfg["n_routed_experts"])]
            )
            out[f"{b}ffn_{ours}_shexp.weight"] = sd[f"{p}mlp.shared_experts.{theirs}.weight"]
    return {name: t.numpy() for name, t in out.items()}


def save_deepseek(folder, tokenizer, vocab_size: int, seed: int = 0, **overrides):
    """A tiny random DeepSeek-V3 folder (tests/tiny.py's shape) of `vocab_size` rows with `tokenizer`."""
    torch.manual_seed(seed)
    cfg = DeepseekV3Config(
        **{
            **BASE,
            "first_k_dense_replace": BASE["num_hidden_layers"],
            "vocab_size": vocab_size,
            "initializer_range": 0.1,
            **overrides,
        }
    )
    DeepseekV3ForCausalLM(cfg).eval().save_pretrained(str(folder))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    return folder
