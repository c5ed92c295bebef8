"""Write a converted model as a Hugging Face folder: config.json, model.safetensors,
tokenizer files, generation_config.json and a model card (README.md)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from latentkv.convert.source_model import SourceModel

TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja"]


def write_weights(out: Path, tensors: dict[str, torch.Tensor]) -> None:
    """model.safetensors (one file; contiguous, unshared tensors)."""
    save_file({k: v.contiguous().clone() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})


def write_tokenizer(out: Path, src: SourceModel) -> None:
    """Tokenizer files: copied from an HF source, built by transformers from a GGUF's metadata."""
    if src.kind == "hf":
        copied = [name for name in TOKENIZER_FILES if (src.path / name).is_file()]
        for name in copied:
            shutil.copy(src.path / name, out / name)
        if copied:
            return
    try:
        tok = src.tokenizer()
    except (OSError, ValueError) as err:  # e.g. a test model saved without a tokenizer
        print(f"latentkv convert: warning: no tokenizer written ({err})")
        return
    if src.chat_template and not getattr(tok, "chat_template", None):
        tok.chat_template = src.chat_template
    tok.save_pretrained(str(out))


def write_generation_config(out: Path, src: SourceModel) -> None:
    """generation_config.json: the source's when it has one, else its bos / eos ids."""
    if src.kind == "hf" and (src.path / "generation_config.json").is_file():
        shutil.copy(src.path / "generation_config.json", out / "generation_config.json")
        return
    gen = {"bos_token_id": src.bos_token_id, "eos_token_id": src.eos_token_id}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")


def model_card(src: SourceModel, cfg: dict, info: dict, settings: dict, measured: dict) -> str:
    """README.md text: source, method, settings, cache size and measured perplexities."""
    ranks = info["ranks"]
    elems = sum(ranks) / len(ranks) + info["rope_dim"]
    lines = [
        "---", "library_name: transformers", "tags: [latentkv, mla, deepseek_v3]", "---", "",
        f"# {src.path.name} converted to Multi-head Latent Attention", "",
        f"- **Source**: `{src.path}` ({src.kind}, {src.arch}; {src.num_layers} layers, {src.num_heads} heads, "
        f"{src.num_kv_heads} KV heads, head dim {src.head_dim}).",
        f"- **Format**: {'stock deepseek_v3 (loads in unmodified transformers / vLLM / SGLang)' if 'latentkv' not in cfg else 'latentkv native (deepseek_v3 layout with the `latentkv` config extensions)'}.",
        "- **Method** (training-free, latentkv): per-frequency PCA of the keys across KV heads weighted by query "
        "energy; RoPE kept on the (component, frequency) pairs with the largest energy × (1 − |φ|²), φ the "
        "attention-weighted mean phase over calibration distances, folded into the query of dropped pairs; "
        "weighted joint low-rank factorization of [K_nope; V] on calibration statistics.",
        f"- **Settings**: {json.dumps(settings)}",
        f"- **Cache**: latent rank {min(ranks)}–{max(ranks)} (mean {sum(ranks) / len(ranks):.1f}) + rope dim "
        f"{info['rope_dim']} = {elems:.1f} elements per token per layer, against {src.kv_elements()} in the source "
        f"({elems / src.kv_elements():.3f}×).",
    ]
    if measured:
        lines += ["", "## Measured", "", "| model | perplexity |", "| --- | --- |"]
        lines += [f"| {k} | {v:.4f} |" for k, v in measured.items() if isinstance(v, float)]
        if "protocol" in measured:
            lines += ["", f"Protocol: {measured['protocol']}."]
    return "\n".join(lines) + "\n"


def export(out: Path, src: SourceModel, cfg: dict, tensors: dict, info: dict, settings: dict, measured: dict) -> Path:
    """Write the whole folder; returns its path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if "latentkv" in cfg:
        cfg = {**cfg, "latentkv": {**cfg["latentkv"], "source": {"path": str(src.path), "kind": src.kind,
                                                                 "arch": src.arch, "settings": settings}}}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_weights(out, tensors)
    write_tokenizer(out, src)
    write_generation_config(out, src)
    (out / "README.md").write_text(model_card(src, cfg, info, settings, measured))
    return out
