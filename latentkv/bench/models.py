"""Default models for the benches: the bundled SmolLM2 GGUF, its default conversion
(shared with `serve`'s cache) and a --stock export of the same settings beside it."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from latentkv.bench.systems import load_hf
from latentkv.convert.api import convert
from latentkv.convert.options import ConvertOptions
from latentkv.resolve import resolve_model
from latentkv.sources.readers import default_gguf_path


def default_models(need_stock: bool) -> tuple[str, str, str | None]:
    """-> (converted native folder, source GGUF, stock folder or None)."""
    native = resolve_model(None).path
    stock = ensure_stock(native) if need_stock else None
    return str(native), str(default_gguf_path()), (str(stock) if stock else None)


def ensure_stock(native: Path, width: int | None = None) -> Path:
    """The stock export of the bundled model (at `width`, e.g. 576 for vLLM-CPU; None: the
    default size), cached next to its native conversion."""
    stock = native.with_name(native.name + "-stock" + (str(width) if width else ""))
    if not (stock / "config.json").exists():
        tmp = stock.with_name(stock.name + ".tmp")
        convert(default_gguf_path(), tmp, ConvertOptions(stock=True, stock_width=width))
        tmp.rename(stock)
    return stock


def ensure_hf_source(native: Path, gguf: Path) -> Path:
    """The original model as a Hugging Face Llama folder (float32, dequantized by transformers from
    the GGUF), cached next to the native conversion: what `vllm serve` loads as the original."""
    folder = native.with_name(native.name + "-original-hf")
    if not (folder / "config.json").exists():
        tmp = folder.with_name(folder.name + ".tmp")
        loaded = load_hf(str(gguf), dtype=torch.float32)  # dequantized, but flagged gguf: not serializable
        config = loaded.config
        config.__dict__.pop("quantization_config", None)
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(loaded.state_dict())
        plain.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
        tmp.rename(folder)
    return folder
