"""Start an engine from `Settings`: resolve the model, size the cache, print the banner."""
from __future__ import annotations

import sys
import time

from latentkv.resolve import ResolvedModel, resolve_model
from latentkv.settings import Settings


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def engine_args(settings: Settings, resolved: ResolvedModel):
    from latentkv.engine.engine import EngineArgs

    return EngineArgs(
        model=str(resolved.path), dtype=settings.dtype, kv_cache_dtype=cache_dtype(settings, resolved),
        block_size=settings.block_size, kv_cache_memory=cache_budget(settings, resolved),
        max_model_len=settings.max_model_len, max_num_seqs=settings.max_num_seqs,
        enable_prefix_caching=settings.enable_prefix_caching, nan_check=settings.nan_check,
        quantization=None if settings.quantization == "none" else settings.quantization,
        kv_store=settings.kv_store, warm=settings.warm, **store_bounds(settings))


def store_bounds(settings: Settings) -> dict:
    """The store's size bound and warm fraction, where set (else the engine's defaults)."""
    return {k: getattr(settings, k) for k in ("kv_store_max_size", "warm_fraction") if getattr(settings, k) is not None}


def cache_dtype(settings: Settings, resolved: ResolvedModel) -> str:
    """As set; else int8 for the bundled model (its default compression was chosen
    counting an int8 latent), else the model dtype ("auto")."""
    if settings.kv_cache_dtype is not None:
        return settings.kv_cache_dtype
    return "int8" if resolved.bundled else "auto"


def cache_budget(settings: Settings, resolved: ResolvedModel):
    """Bytes for the latent cache: as given, or `kv_cache_blocks` blocks of this model."""
    if settings.kv_cache_blocks is None:
        return settings.kv_cache_memory
    from latentkv.config import ModelConfig
    from latentkv.engine.runner import bytes_per_block
    cfg = ModelConfig.from_file(resolved.path / "config.json")
    return settings.kv_cache_blocks * bytes_per_block(cfg, settings.block_size, model_dtype(settings),
                                                      cache_dtype(settings, resolved))


def model_dtype(settings: Settings):
    import torch
    from latentkv.model.loader import resolve_dtype
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return resolve_dtype(settings.dtype, device)


def start_engine(settings: Settings):
    """-> (LLMEngine, ResolvedModel), after printing the startup banner."""
    from latentkv.engine.engine import LLMEngine

    started = time.perf_counter()
    resolved = resolve_model(settings.model, log=log)
    engine = LLMEngine.from_args(engine_args(settings, resolved))
    for line in banner(engine, resolved, settings):
        log(line)
    log(f"latentkv: ready in {time.perf_counter() - started:.1f} s")
    return engine, resolved


def banner(engine, resolved: ResolvedModel, settings: Settings) -> list[str]:
    """Model, KV bytes per token (original / compressed / ratio), cache capacity."""
    from latentkv.cache.accounting import account, gqa_bytes_per_token

    cfg = engine.cfg
    dtype = str(engine.model.dtype).removeprefix("torch.")
    cache_dtype = engine.args.kv_cache_dtype
    acct = account(cfg, cache_dtype, dtype)
    if resolved.original is not None:
        g = resolved.original
        original = gqa_bytes_per_token(g.num_layers, g.num_kv_heads, g.head_dim, dtype)
        what = f"source {g.num_layers} layers x {g.num_kv_heads} KV heads x {g.head_dim}, {dtype}"
    else:
        original = acct.mha_bytes_per_token
        what = f"MHA of the same shape, {dtype}"
    compressed = acct.bytes_per_token
    where = f" (converted from {resolved.source}{', cached' if resolved.from_cache else ''})" if resolved.source else ""
    return [
        f"latentkv: model {resolved.name} at {resolved.path}{where}",
        f"latentkv: {cfg.num_hidden_layers} layers, latent rank {cfg.kv_lora_rank} + rope {cfg.qk_rope_head_dim}, "
        f"weights {dtype}{' (' + engine.args.quantization + ' linears)' if engine.args.quantization else ''}, "
        f"cache {cache_dtype}",
        f"latentkv: KV bytes per token: original {original} ({what}) / compressed {compressed} / "
        f"ratio {original / compressed:.2f}x",
        f"latentkv: cache capacity {engine.capacity_tokens} tokens "
        f"({engine.pool.num_blocks} blocks of {engine.args.block_size}), max_model_len {engine.max_model_len}",
    ]
