"""What a conversion starts from: one Llama-family model held in memory.

`SourceModel`'s tensors use Hugging Face Llama names, in float32, with RoPE in the
Hugging Face "rotate half" layout (pair i = dims (i, i + d/2)). The readers
(gguf_reader.py, hf_reader.py) build it; readers.py (`read_source`) picks the reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from latentkv.sources.tensor_store import TensorStore


class SourceError(ValueError):
    """A source model that cannot be read or converted; the message says why."""


@dataclass
class SourceModel:
    """A Llama-family decoder: shapes, RoPE frequencies and float32 weights.

    `tensors` maps Hugging Face names (`model.layers.{i}.self_attn.q_proj.weight`, ...)
    to tensors; `inv_freq [head_dim/2]` is each rotate-half pair's angle per token.
    """

    path: Path
    kind: str  # "gguf" or "hf"
    arch: str  # "llama", "qwen2" or "mistral"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    inv_freq: torch.Tensor
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    bos_token_id: int | None
    eos_token_id: int | list[int] | None
    chat_template: str | None = None
    tensors: TensorStore = field(default=None, repr=False)
    _tokenizer: object = field(default=None, init=False, repr=False, compare=False)
    _layer: tuple = field(default=(None, None), init=False, repr=False, compare=False)

    def layer(self, i: int) -> dict[str, torch.Tensor | None]:
        """Layer i's weights under short names (q, k, v, o, q_bias, ..., gate, up, down).

        The last layer read is kept: passes over the layers read each one once."""
        if self._layer[0] == i:
            return self._layer[1]
        p = f"model.layers.{i}."
        t = self.tensors
        layer = {
            "attn_norm": t[p + "input_layernorm.weight"],
            "q": t[p + "self_attn.q_proj.weight"],
            "k": t[p + "self_attn.k_proj.weight"],
            "v": t[p + "self_attn.v_proj.weight"],
            "o": t[p + "self_attn.o_proj.weight"],
            "q_bias": t.get(p + "self_attn.q_proj.bias"),
            "k_bias": t.get(p + "self_attn.k_proj.bias"),
            "v_bias": t.get(p + "self_attn.v_proj.bias"),
            "mlp_norm": t[p + "post_attention_layernorm.weight"],
            "gate": t[p + "mlp.gate_proj.weight"],
            "up": t[p + "mlp.up_proj.weight"],
            "down": t[p + "mlp.down_proj.weight"],
        }
        self._layer = (i, layer)
        return layer

    def lm_head(self) -> torch.Tensor:
        """[vocab, hidden] output projection (the embedding when tied)."""
        return self.tensors["lm_head.weight" if "lm_head.weight" in self.tensors else "model.embed_tokens.weight"]

    def kv_elements(self) -> int:
        """KV cache elements per token per layer: 2 * Hkv * d."""
        return 2 * self.num_kv_heads * self.head_dim

    def tokenizer(self):
        """A transformers tokenizer for this model (loaded once: from a GGUF it takes seconds)."""
        from transformers import AutoTokenizer

        if self._tokenizer is None:
            if self.kind == "gguf":
                self._tokenizer = AutoTokenizer.from_pretrained(str(self.path.parent), gguf_file=self.path.name)
            else:
                self._tokenizer = AutoTokenizer.from_pretrained(str(self.path))
        return self._tokenizer


def check_tensors(source: SourceModel) -> None:
    """Raise SourceError naming the file and the first missing or misshapen tensor."""
    D, d = source.hidden_size, source.head_dim
    H, Hkv, F = source.num_heads, source.num_kv_heads, source.intermediate_size
    shapes = {"model.embed_tokens.weight": (source.vocab_size, D), "model.norm.weight": (D,)}
    for i in range(source.num_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (D,),
                p + "post_attention_layernorm.weight": (D,),
                p + "self_attn.q_proj.weight": (H * d, D),
                p + "self_attn.k_proj.weight": (Hkv * d, D),
                p + "self_attn.v_proj.weight": (Hkv * d, D),
                p + "self_attn.o_proj.weight": (D, H * d),
                p + "mlp.gate_proj.weight": (F, D),
                p + "mlp.up_proj.weight": (F, D),
                p + "mlp.down_proj.weight": (D, F),
            }
        )
        if source.qkv_bias:
            shapes.update(
                {
                    p + "self_attn.q_proj.bias": (H * d,),
                    p + "self_attn.k_proj.bias": (Hkv * d,),
                    p + "self_attn.v_proj.bias": (Hkv * d,),
                }
            )
    for name, shape in shapes.items():
        if name not in source.tensors:
            raise SourceError(f"{source.path}: missing tensor {name}")
        if tuple(source.tensors.shapes[name]) != shape:
            raise SourceError(
                f"{source.path}: tensor {name} has shape {tuple(source.tensors.shapes[name])}, expected {shape}"
            )
