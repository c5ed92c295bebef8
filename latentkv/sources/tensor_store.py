"""A source's tensors, read from their files one at a time (float32, Hugging Face names).

`TensorStore` is a read-only mapping name -> tensor that knows every tensor's shape up
front and reads a tensor only when asked (safetensors and GGUF are both laid out for
this: an index, then each tensor's bytes at an offset). A converter that walks the model
layer by layer holds one layer's weights, not the model. Small models are kept resident
after the first read (`resident=True`): re-reading a dequantized GGUF for every
perplexity window costs more than the memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Callable, Iterator

import torch

RESIDENT_BYTES = 2 << 30  # float32 size up to which a source is kept in memory once read


class TensorStore(Mapping):
    """name -> float32 tensor, read on access by `read(name)`; shapes [name] known without reading."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], read: Callable[[str], torch.Tensor], resident: bool):
        self.shapes = dict(shapes)
        self._read = read
        self._resident = resident
        self._cache: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.shapes:
            raise KeyError(name)
        if name in self._cache:
            return self._cache[name]
        tensor = self._read(name)
        if self._resident:
            self._cache[name] = tensor
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def drop(self, name: str) -> None:
        """Forget a tensor (e.g. a tied lm_head the model does not use)."""
        self.shapes.pop(name, None)
        self._cache.pop(name, None)

    def float32_bytes(self) -> int:
        """Bytes of all tensors in float32."""
        total = 0
        for shape in self.shapes.values():
            n = 1
            for s in shape:
                n *= s
            total += 4 * n
        return total


def resident_default(shapes: dict[str, tuple[int, ...]], limit: int | None) -> bool:
    """Whether a source of these shapes is kept in memory (its float32 size within `limit`)."""
    limit = RESIDENT_BYTES if limit is None else limit
    return TensorStore(shapes, lambda name: None, False).float32_bytes() <= limit
