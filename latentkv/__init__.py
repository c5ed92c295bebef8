"""latentkv: Multi-head Latent Attention inference, conversion and measurement."""

from __future__ import annotations

from latentkv.engine.outputs import RequestOutput
from latentkv.guided import GuidedDecodingParams
from latentkv.llm import LLM
from latentkv.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "GuidedDecodingParams"]
