"""Training-free conversion of Llama-family GQA/MHA models to Multi-head Latent Attention."""
from __future__ import annotations


def convert(*args, **kwargs):
    """See `latentkv.convert.api.convert` (imported lazily: torch-heavy)."""
    from latentkv.convert.api import convert as run

    return run(*args, **kwargs)


__all__ = ["convert"]
