"""latentkv: Multi-head Latent Attention inference, conversion and measurement."""
from __future__ import annotations

__all__ = ["LLM", "SamplingParams", "RequestOutput"]


def __getattr__(name: str):
    # Lazy, so `import latentkv` (e.g. for the CLI or the converter) does not load the engine.
    if name == "LLM":
        from latentkv.llm import LLM
        return LLM
    if name == "SamplingParams":
        from latentkv.sampling import SamplingParams
        return SamplingParams
    if name == "RequestOutput":
        from latentkv.engine.outputs import RequestOutput
        return RequestOutput
    raise AttributeError(f"module 'latentkv' has no attribute {name!r}")
