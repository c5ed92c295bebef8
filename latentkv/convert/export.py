"""Write a converted model as a Hugging Face folder: config.json, safetensors shards
(model.safetensors when one is enough), tokenizer files, generation_config.json and a
model card (README.md)."""

from __future__ import annotations

import json
import os
import shutil
from typing import Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file

from latentkv.sources.source_model import SourceModel

TOKENIZER_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
]


SHARD_BYTES = 1 << 30  # a shard is closed once it holds this much


def write_weights(out: Path, parts: Iterable[dict[str, torch.Tensor]], shard_bytes: int | None = None) -> None:
    """Write the tensors of `parts` (dicts, consumed one at a time) as safetensors shards of about
    shard_bytes: model.safetensors when one shard holds everything, else
    model-0000k-of-0000n.safetensors with model.safetensors.index.json. Holds one shard."""
    shard_bytes = SHARD_BYTES if shard_bytes is None else shard_bytes
    shards, pending, size = [], {}, 0

    def flush():
        name = f"shard-{len(shards):05d}.tmp.safetensors"
        save_file({k: v.contiguous().clone() for k, v in pending.items()}, str(out / name), metadata={"format": "pt"})
        shards.append((name, list(pending)))

    for part in parts:
        for name, tensor in part.items():
            pending[name] = tensor
            size += tensor.numel() * tensor.element_size()
        if size >= shard_bytes:
            flush()
            pending, size = {}, 0
    if pending or not shards:
        flush()
    if len(shards) == 1:
        os.replace(out / shards[0][0], out / "model.safetensors")
        return
    weight_map = {}
    for k, (tmp, names) in enumerate(shards, 1):
        final = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        os.replace(out / tmp, out / final)
        weight_map.update({n: final for n in names})
    index = {
        "metadata": {"total_size": sum((out / f).stat().st_size for f in set(weight_map.values()))},
        "weight_map": weight_map,
    }
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


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
        "---",
        "library_name: transformers",
        "tags: [latentkv, mla, deepseek_v3]",
        "---",
        "",
        f"# {src.path.name} converted to Multi-head Latent Attention",
        "",
        f"- **Source**: `{src.path}` ({src.kind}, {src.arch}; {src.num_layers} layers, {src.num_heads} heads, "
        f"{src.num_kv_heads} KV heads, head dim {src.head_dim}).",
        "- **Format**: "
        + (
            "stock deepseek_v3 (loads in unmodified transformers / vLLM / SGLang)."
            if "latentkv" not in cfg
            else "latentkv native (deepseek_v3 layout with the `latentkv` config extensions)."
        ),
        "- **Method** (training-free, latentkv): per-frequency PCA of the keys across KV heads weighted by query "
        "energy; RoPE kept on the (component, frequency) pairs with the largest energy × (1 − |φ|²), φ the "
        "attention-weighted mean phase over calibration distances, folded into the query of dropped pairs; "
        "weighted joint low-rank factorization of [K_nope; V] on calibration statistics.",
        f"- **Settings**: {json.dumps(settings)}",
        f"- **Cache**: latent rank {min(ranks)}–{max(ranks)} (mean {sum(ranks) / len(ranks):.1f}) + rope dim "
        f"{info['rope_dim']} = {elems:.1f} elements per token per layer, against {src.kv_elements()} in the source "
        f"({elems / src.kv_elements():.3f}×).",
    ]
    fits = [f for f in info.get("refined", []) if f]
    if fits:
        lines.append(
            f"- **Refinement**: {settings.get('refine_steps')} Adam steps per layer on the calibration windows "
            f"(the attention output fitted to the source's); held-out relative attention error, mean over "
            f"{len(fits)} layers, {sum(f['before'] for f in fits) / len(fits):.4f} → "
            f"{sum(min(f['before'], f['after']) for f in fits) / len(fits):.4f} "
            f"({sum(f['kept'] for f in fits)} layers refined, the others kept the closed form)."
        )
    if measured:
        lines += ["", "## Measured", "", "| model | perplexity |", "| --- | --- |"]
        lines += [f"| {k} | {v:.4f} |" for k, v in measured.items() if isinstance(v, float)]
        if "protocol" in measured:
            lines += ["", f"Protocol: {measured['protocol']}."]
    return "\n".join(lines) + "\n"


def export(
    out: Path, src: SourceModel, cfg: dict, parts, info: dict, settings: dict, shard_bytes: int | None = None
) -> Path:
    """Write the folder but the model card (write_card, once measured); `parts`: a dict of
    tensors or an iterable of dicts (pipeline.convert_parts), written as they come."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*.safetensors")) + list(out.glob("model.safetensors.index.json")):
        old.unlink()  # a folder converted again must not keep a previous run's shards
    if "latentkv" in cfg:
        cfg = {
            **cfg,
            "latentkv": {
                **cfg["latentkv"],
                "source": {"path": str(src.path), "kind": src.kind, "arch": src.arch, "settings": settings},
            },
        }
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    write_weights(out, [parts] if isinstance(parts, dict) else parts, shard_bytes)
    write_tokenizer(out, src)
    write_generation_config(out, src)
    return out


def write_card(out: Path, src: SourceModel, cfg: dict, info: dict, settings: dict, measured: dict) -> None:
    """README.md: the model card."""
    (Path(out) / "README.md").write_text(model_card(src, cfg, info, settings, measured))
