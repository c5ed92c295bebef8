"""Read a Llama-architecture GGUF file into a `SourceModel` (float32, Hugging Face names).

Quantized tensors are dequantized with `gguf.quants.dequantize`; llama.cpp stores the
rows of `attn_q` / `attn_k` permuted (pairs interleaved per head), which is undone here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from latentkv.rope import default_inv_freq
from latentkv.sources.source_model import SourceError, SourceModel, check_tensors
from latentkv.sources.tensor_store import TensorStore, resident_default

# GGUF tensor name (after "blk.{i}.") -> Hugging Face name (after "model.layers.{i}.")
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
TOP_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
UNSUPPORTED = {
    "attn_q_norm": "QK-norm (attn_q_norm)",
    "attn_k_norm": "QK-norm (attn_k_norm)",
    "ffn_gate_inp": "mixture of experts (ffn_gate_inp)",
    "attn_output.bias": "attention output bias",
}


def open_reader(path: Path):
    """A GGUFReader, with a clear message when the file is not a readable GGUF."""
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except Exception as err:  # the reader raises many kinds on truncated / foreign files
        raise SourceError(f"{path}: not a readable GGUF file ({type(err).__name__}: {err})") from err


def read_field(reader, key: str, default=None):
    """One metadata value (scalar, string or list), or default when absent."""
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's row permutation: [n_head*d, ...] interleaved pairs -> rotate-half."""
    d = w.shape[0] // n_head
    return w.reshape(n_head, d // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def dequantize(path: Path, tensor) -> torch.Tensor:
    """One GGUF tensor as float32 torch, in PyTorch's [out, in] order."""
    import gguf

    try:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(int(s) for s in reversed(tensor.shape))
        return torch.from_numpy(np.array(data, dtype=np.float32).reshape(shape))
    except Exception as err:
        raise SourceError(f"{path}: cannot read tensor {tensor.name} ({type(err).__name__}: {err})") from err


def hf_name(name: str) -> str | None:
    """Map a GGUF tensor name to its Hugging Face name (None: not a weight we use)."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    parts = name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    return None


def read_gguf(path: Path, resident_limit: int | None = None) -> SourceModel:
    """Read a Llama GGUF: metadata, float32 tensors (Q/K un-permuted, dequantized on use;
    kept in memory when their float32 size is within resident_limit), chat template."""
    reader = open_reader(path)
    arch = read_field(reader, "general.architecture")
    if arch != "llama":
        raise SourceError(f"{path}: GGUF architecture {arch!r} is not supported (only 'llama')")
    for tensor in reader.tensors:
        for key, what in UNSUPPORTED.items():
            if key in tensor.name:
                raise SourceError(f"{path}: unsupported: {what} in tensor {tensor.name}")
    if read_field(reader, "llama.rope.scaling.type") not in (None, "none"):
        raise SourceError(f"{path}: unsupported: RoPE scaling {read_field(reader, 'llama.rope.scaling.type')!r}")
    required = [
        "llama.block_count",
        "llama.embedding_length",
        "llama.feed_forward_length",
        "llama.attention.head_count",
    ]
    for key in required:
        if read_field(reader, key) is None:
            raise SourceError(f"{path}: missing metadata {key}")
    H = int(read_field(reader, "llama.attention.head_count"))
    Hkv = int(read_field(reader, "llama.attention.head_count_kv", H))
    D = int(read_field(reader, "llama.embedding_length"))
    d = int(read_field(reader, "llama.attention.key_length", D // H))
    theta = float(read_field(reader, "llama.rope.freq_base", 10000.0))
    by_name = {hf_name(t.name): t for t in reader.tensors if hf_name(t.name) is not None}

    def read(name: str) -> torch.Tensor:
        tensor = by_name[name]
        w = dequantize(path, tensor)
        if tensor.name.endswith("attn_q.weight") or tensor.name.endswith("attn_q.bias"):
            w = unpermute(w, H)
        elif tensor.name.endswith("attn_k.weight") or tensor.name.endswith("attn_k.bias"):
            w = unpermute(w, Hkv)
        return w

    shapes = {name: tuple(int(s) for s in reversed(t.shape)) for name, t in by_name.items()}
    tensors = TensorStore(shapes, read, resident_default(shapes, resident_limit))
    if "model.embed_tokens.weight" not in tensors:
        raise SourceError(f"{path}: missing tensor token_embd.weight")
    vocab = int(read_field(reader, "llama.vocab_size", shapes["model.embed_tokens.weight"][0]))
    source = SourceModel(
        path=path,
        kind="gguf",
        arch="llama",
        vocab_size=vocab,
        hidden_size=D,
        intermediate_size=int(read_field(reader, "llama.feed_forward_length")),
        num_layers=int(read_field(reader, "llama.block_count")),
        num_heads=H,
        num_kv_heads=Hkv,
        head_dim=d,
        rms_norm_eps=float(read_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=theta,
        inv_freq=default_inv_freq(d, theta),
        max_position_embeddings=int(read_field(reader, "llama.context_length", 4096)),
        tie_word_embeddings="lm_head.weight" not in tensors,
        qkv_bias=any(n.endswith("q_proj.bias") for n in tensors),
        bos_token_id=read_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=read_field(reader, "tokenizer.ggml.eos_token_id"),
        chat_template=read_field(reader, "tokenizer.chat_template"),
        tensors=tensors,
    )
    check_tensors(source)
    return source
