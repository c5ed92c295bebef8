"""latentkv: Multi-head Latent Attention inference, conversion and measurement."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from latentkv.engine.outputs import RequestOutput
    from latentkv.guided import GuidedDecodingParams
    from latentkv.llm import LLM
    from latentkv.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "GuidedDecodingParams"]

# The API's names are imported on first use (PEP 562), not with the package: a process that needs one
# module of latentkv (a spawned bench baseline, a converter) does not import the engine, llguidance
# and transformers first.
_HOMES = {
    "LLM": "latentkv.llm",
    "SamplingParams": "latentkv.sampling_params",
    "RequestOutput": "latentkv.engine.outputs",
    "GuidedDecodingParams": "latentkv.guided",
}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'latentkv' has no attribute {name!r}")
