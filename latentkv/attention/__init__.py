"""Attention backends over the paged latent cache (interface: backend.py, docs/internals.md)."""
from __future__ import annotations

import warnings

from . import native
from .backend import AttentionBackend
from .native import NativeBackend
from .torch_ref import TorchBackend

# The selection point: "native" (C++/OpenMP, CPU) where it builds, "torch" (the reference) anywhere.
BACKENDS: dict[str, type[AttentionBackend]] = {"native": NativeBackend, "torch": TorchBackend}
BACKEND_CHOICES = ("auto", "native", "torch")  # "auto": native where it builds, else torch
_warned: list[str] = []


def resolve_backend(name: str = "auto") -> str:
    """"auto" -> "native" where the extension builds and loads, else "torch" (with one warning per process)."""
    if name != "auto":
        return name
    if native.available():
        return "native"
    if not _warned:
        _warned.append(native.unavailable_reason() or "")
        warnings.warn(f"latentkv: the native CPU attention kernel is unavailable ({_warned[0]}); using the PyTorch "
                      "reference backend (correct, slower). Install a C++ compiler and ninja to build it.",
                      RuntimeWarning, stacklevel=2)
    return "torch"


def get_backend(name: str = "auto") -> AttentionBackend:
    name = resolve_backend(name)
    if name not in BACKENDS:
        raise ValueError(f"attention backend {name!r} is not available; expected one of {['auto', *sorted(BACKENDS)]}")
    return BACKENDS[name]()
