"""Default models for the benches: the bundled SmolLM2 GGUF, its default conversion
(shared with `serve`'s cache) and a --stock export of the same settings beside it."""
from __future__ import annotations

from pathlib import Path

from latentkv.convert.api import convert
from latentkv.convert.sources import default_gguf_path
from latentkv.resolve import resolve_model


def default_models(need_stock: bool) -> tuple[str, str, str | None]:
    """-> (converted native folder, source GGUF, stock folder or None)."""
    native = resolve_model(None).path
    stock = ensure_stock(native) if need_stock else None
    return str(native), str(default_gguf_path()), (str(stock) if stock else None)


def ensure_stock(native: Path) -> Path:
    """The stock export of the bundled model, cached next to its native conversion."""
    stock = native.with_name(native.name + "-stock")
    if not (stock / "config.json").exists():
        tmp = stock.with_name(stock.name + ".tmp")
        convert(source=default_gguf_path(), out=tmp, stock=True)
        tmp.rename(stock)
    return stock
