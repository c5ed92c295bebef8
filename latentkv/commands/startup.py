"""Start an engine from `Settings`: resolve the model, build its EngineArgs, print the banner."""

from __future__ import annotations

import sys
import time

from latentkv.cache.accounting import account, gqa_bytes_per_token
from latentkv.engine.args import EngineArgs
from latentkv.engine.engine import LLMEngine
from latentkv.facts import dtype_name
from latentkv.resolve import ResolvedModel, resolve_model
from latentkv.settings import Settings


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def engine_args(settings: Settings, resolved: ResolvedModel) -> EngineArgs:
    """The cache dtype as set, else "auto": the folder's own format where it records one (a default
    conversion records int8_rope8: convert/api.py), else the model dtype."""
    return settings.engine_args(str(resolved.path), settings.kv_cache_dtype or "auto")


def start_engine(settings: Settings) -> tuple[LLMEngine, ResolvedModel]:
    """-> (LLMEngine, ResolvedModel), after printing the startup banner."""
    started = time.perf_counter()
    resolved = resolve_model(settings.model, log=log)
    engine = LLMEngine.from_args(engine_args(settings, resolved))
    for line in banner(engine, resolved):
        log(line)
    log(f"latentkv: ready in {time.perf_counter() - started:.1f} s")
    return engine, resolved


def banner(engine: LLMEngine, resolved: ResolvedModel) -> list[str]:
    """Model, KV bytes per token (original / compressed / ratio), cache capacity."""
    cfg = engine.cfg
    dtype = dtype_name(engine.model.dtype)
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
