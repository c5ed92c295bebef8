"""The GGUF reader on a tiny Llama written with the gguf package the way llama.cpp lays it out."""
from __future__ import annotations

import pytest
import torch

from latentkv.sources.readers import SourceError, read_source
from latentkv.sources.reference import source_logits

import llama_tiny

NAMES = {"self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
         "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
         "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
         "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
         "mlp.down_proj.weight": "ffn_down.weight"}


def permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's convert_hf_to_gguf permutation of Q / K rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, model, skip: str | None = None) -> None:
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_vocab_size(cfg.vocab_size)
    tensors = {"token_embd.weight": model.model.embed_tokens.weight, "output_norm.weight": model.model.norm.weight,
               "output.weight": model.lm_head.weight}
    for name, p in model.model.layers.named_parameters():
        i, rest = name.split(".", 1)
        w = p.detach()
        if rest == "self_attn.q_proj.weight":
            w = permute(w, cfg.num_attention_heads)
        elif rest == "self_attn.k_proj.weight":
            w = permute(w, cfg.num_key_value_heads)
        tensors[f"blk.{i}.{NAMES[rest]}"] = w
    for name, w in tensors.items():
        if name != skip:
            writer.add_tensor(name, w.detach().float().contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_tiny_gguf_matches_transformers(tmp_path):
    model = llama_tiny.build("llama_gqa")
    write_gguf(tmp_path / "tiny.gguf", model)
    src = read_source(tmp_path / "tiny.gguf")
    assert (src.num_heads, src.num_kv_heads, src.head_dim) == (4, 2, 16) and not src.tie_word_embeddings
    ids = torch.randint(0, llama_tiny.VOCAB, (1, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(ids).logits
    assert (source_logits(src, ids) - expected).abs().max() <= 1e-4


def test_gguf_missing_tensor_is_named(tmp_path):
    write_gguf(tmp_path / "cut.gguf", llama_tiny.build("llama_gqa"), skip="blk.1.attn_v.weight")
    with pytest.raises(SourceError, match=r"cut\.gguf: missing tensor model\.layers\.1\.self_attn\.v_proj\.weight"):
        read_source(tmp_path / "cut.gguf")
