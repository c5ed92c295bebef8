"""Default models for the benches: the bundled SmolLM2 GGUF and its conversions
(native at the default compression, and a --stock export), converted once and cached."""
from __future__ import annotations

from pathlib import Path


def default_models(need_stock: bool) -> tuple[str, str, str | None]:
    """-> (converted native folder, source GGUF, stock folder or None)."""
    from ..convert.sources import default_gguf_path
    from ..resolve import resolve_model

    source = str(default_gguf_path())
    native = resolve_model(None)
    stock = resolve_model(None, stock=True) if need_stock else None
    return str(native), source, (str(stock) if stock else None)


def cache_root() -> Path:
    return Path.home() / ".cache" / "latentkv"
