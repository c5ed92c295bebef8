"""What the engine reads from a model folder besides its weights: the tokenizer, the EOS ids
(generation_config.json, else config.json, else the tokenizer) and the cache format the folder records."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from transformers import AutoTokenizer

from latentkv.config import ModelConfig
from latentkv.engine.args import EngineArgs
from latentkv.facts import MODEL_DTYPES, UNQUANTIZED_CACHES, dtype_name

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")


def load_tokenizer(path: str):
    """AutoTokenizer from a folder; a broken tokenizer file is a ValueError naming the folder's files."""
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as err:  # noqa: BLE001 - tokenizers/transformers raise many kinds (even plain Exception)
        present = [f for f in TOKENIZER_FILES if (Path(path) / f).exists()]
        where = ", ".join(str(Path(path) / f) for f in present) or str(path)
        raise ValueError(f"cannot load the tokenizer from {where}: {type(err).__name__}: {err}") from None


def find_eos_token_ids(folder: Path, cfg, tokenizer) -> list[int]:
    """EOS ids from generation_config.json, else config.json, else the tokenizer."""
    gen = folder / "generation_config.json"
    if gen.exists():
        try:
            eos = json.loads(gen.read_text()).get("eos_token_id")
        except (ValueError, AttributeError) as err:
            raise ValueError(f"{gen}: not a JSON object ({type(err).__name__}: {err})") from None
        if isinstance(eos, bool) or not (
            eos is None or isinstance(eos, int) or (isinstance(eos, list) and all(type(t) is int for t in eos))
        ):
            raise ValueError(f"{gen}: eos_token_id must be an integer or a list of integers, got {eos!r}")
        if eos is not None:
            return list(eos) if isinstance(eos, list) else [eos]
    if cfg.eos_token_ids:
        return cfg.eos_token_ids
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return [tokenizer.eos_token_id]
    return []


def with_folder_cache(args: EngineArgs, cfg: ModelConfig, dtype: torch.dtype) -> EngineArgs:
    """kv_cache_dtype "auto" is the folder's own cache format where it records one
    (latentkv.cache_dtype: `convert` records it), else the model dtype; "bfloat16" /
    "float32" the unquantized latent, which is stored in the model dtype `dtype`."""
    asked = args.kv_cache_dtype
    if asked in UNQUANTIZED_CACHES and MODEL_DTYPES[asked] != dtype:
        raise ValueError(
            f"kv_cache_dtype = {asked!r}: the unquantized latent is stored in the model dtype, "
            f"{dtype_name(dtype)} here (set dtype = {asked!r}, or kv_cache_dtype = {dtype_name(dtype)!r})"
        )
    return replace(args, kv_cache_dtype=cfg.served_cache_dtype(asked))
