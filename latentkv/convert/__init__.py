"""Training-free conversion of Llama-family GQA/MHA models to Multi-head Latent Attention."""

from __future__ import annotations

from latentkv.convert.api import convert
from latentkv.convert.options import ConvertOptions

__all__ = ["ConvertOptions", "convert"]
