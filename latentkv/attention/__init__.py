"""Attention backends over the paged latent cache (interface: backend.py, docs/internals.md)."""
from __future__ import annotations

from .backend import AttentionBackend
from .torch_ref import TorchBackend

# The selection point: a native CPU kernel backend or a GPU one registers here.
BACKENDS: dict[str, type[AttentionBackend]] = {"torch": TorchBackend}


def get_backend(name: str = "torch") -> AttentionBackend:
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is not available; expected one of {sorted(BACKENDS)}")
    return BACKENDS[name]()
