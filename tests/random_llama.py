"""A random-weight Llama Hugging Face folder of any shape, written one layer per shard (so an 8B
shape never sits in memory). Speed and memory of a conversion need the shape, not real weights.

    python tests/random_llama.py OUT --shape 1b      # 16 layers, hidden 2048, 32/8 heads
    python tests/random_llama.py OUT --shape 8b      # 32 layers, hidden 4096, ~15 GB bf16

The tokenizer is the bundled SmolLM2's (the only one available offline), so the vocabulary is
at least its 49152 tokens (calibration text must not index past the embedding).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from latentkv.sources.readers import default_gguf_path

TOKENIZER_VOCAB = 49152  # SmolLM2's
SHAPES = {
    "small": dict(
        num_hidden_layers=4, hidden_size=256, num_attention_heads=8, num_key_value_heads=2, intermediate_size=512
    ),
    "1b": dict(
        num_hidden_layers=16,
        hidden_size=2048,
        num_attention_heads=32,
        num_key_value_heads=8,
        intermediate_size=8192,
        tie_word_embeddings=True,
    ),
    "8b": dict(
        num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336
    ),
}


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """A 256-token tokenizer (one token per byte, any text): a model's embedding then costs nothing
    next to its layers, for tests that measure the memory of the layers."""
    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def layer_shapes(cfg: dict, i: int) -> dict[str, tuple[int, ...]]:
    """Hugging Face names and shapes of layer i's tensors."""
    D, F = cfg["hidden_size"], cfg["intermediate_size"]
    d = D // cfg["num_attention_heads"]
    H, Hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    p = f"model.layers.{i}."
    return {
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


def random_tensor(name: str, shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """Norm weights near 1, matrices N(0, 1/fan_in) (activations keep their scale through the layers)."""
    if name.endswith("norm.weight"):
        return (1 + 0.1 * torch.randn(shape, generator=gen)).to(dtype)
    return (torch.randn(shape, generator=gen) * shape[-1] ** -0.5).to(dtype)


def write_random_llama(
    folder: str | Path,
    vocab_size: int = TOKENIZER_VOCAB,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    tokenizer=True,
    **shape,
) -> Path:
    """Write config.json, one safetensors shard per layer (+ one for the embeddings) with an index,
    and a tokenizer (True: the bundled one; or a tokenizer object; False: none); returns the
    folder. shape: LlamaConfig fields (SHAPES)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).split(".")[1],
        **shape,
    }
    cfg["head_dim"] = cfg["hidden_size"] // cfg["num_attention_heads"]
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen = torch.Generator().manual_seed(seed)
    L = cfg["num_hidden_layers"]
    top = {"model.embed_tokens.weight": (vocab_size, cfg["hidden_size"]), "model.norm.weight": (cfg["hidden_size"],)}
    if not cfg["tie_word_embeddings"]:
        top["lm_head.weight"] = (vocab_size, cfg["hidden_size"])
    groups = [top] + [layer_shapes(cfg, i) for i in range(L)]
    weight_map, total = {}, 0
    for k, group in enumerate(groups, 1):
        name = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        tensors = {n: random_tensor(n, s, gen, dtype) for n, s in group.items()}
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update({n: name for n in tensors})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    if tokenizer is True:
        gguf = default_gguf_path()
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if tokenizer:
        tokenizer.save_pretrained(str(folder))
    return folder


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--shape", choices=list(SHAPES), default="small")
    p.add_argument("--vocab-size", type=int, default=TOKENIZER_VOCAB)
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    args = p.parse_args()
    if args.vocab_size < TOKENIZER_VOCAB:
        p.error(f"--vocab-size must be at least the tokenizer's {TOKENIZER_VOCAB}")
    write_random_llama(args.out, args.vocab_size, getattr(torch, args.dtype), **SHAPES[args.shape])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
