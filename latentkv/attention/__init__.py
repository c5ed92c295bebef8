"""Attention backends over the paged latent cache (interface: backend.py, docs/internals.md)."""

from __future__ import annotations

from ..facts import ATTENTION_BACKENDS
from ..kernels import attention as attention_kernels
from .backend import AttentionBackend
from .native_backend import NativeBackend
from .torch_ref import TorchBackend

# The selection point: "native" (C++/OpenMP, CPU) where it builds, "torch" (the reference) anywhere.
BACKENDS: dict[str, type[AttentionBackend]] = {"native": NativeBackend, "torch": TorchBackend}
assert set(BACKENDS) | {"auto"} == set(ATTENTION_BACKENDS)


def resolve_backend(name: str = "auto") -> str:
    """ "auto" -> "native" where the extension builds and loads, else "torch" (kernels/build.py
    warns once why the native one is unavailable)."""
    if name != "auto":
        return name
    return "native" if attention_kernels.available() else "torch"


def get_backend(name: str = "auto") -> AttentionBackend:
    name = resolve_backend(name)
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is not available; expected one of {list(ATTENTION_BACKENDS)}")
    return BACKENDS[name]()
