"""Calibration's large intermediates on disk once they pass a budget, read back a piece at a time.

Two things grow with the model: the residual stream of the calibration windows (tokens × D × 4
bytes, twice while a layer moves it on: 512 MiB at hidden 4096 and 16384 tokens) and the
statistics E[x̃x̃ᵀ] ((D+1)² × 8 bytes per layer: 4.3 GB for 32 layers at hidden 4096, all held
until the conversion reads them back layer by layer). Past `BUDGET` each goes to plain files
in a scratch folder (next to the output, not /tmp, which may be RAM) and is read back with
read() into ordinary memory when used — so the peak RSS holds one batch and one layer's
statistics, and float64 round-trips exactly (the numbers do not change).
"""

from __future__ import annotations

import itertools
import weakref
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from latentkv.convert.calibrate import LayerStats

BUDGET = 1 << 30  # bytes of activations, or of all layers' statistics, kept in memory

_names = itertools.count()


def save(tensor: torch.Tensor, folder: Path) -> tuple[Path, tuple[int, ...], torch.dtype]:
    """Write a CPU tensor's bytes to a new file in folder; (path, shape, dtype) to load it."""
    path = folder / f"{next(_names):08d}.bin"
    tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tofile(path)  # bytes: any dtype, bfloat16 too
    return path, tuple(tensor.shape), tensor.dtype


def load(path: Path, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor written by save, in fresh memory."""
    return torch.from_numpy(np.fromfile(path, dtype=np.uint8)).view(dtype).reshape(shape)


class DiskBatches:
    """A list of tensors (batches [B, T, D]) kept in files: append writes one, iterating reads them
    back one at a time. The files go when the object does."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._items: list[tuple[Path, tuple[int, ...], torch.dtype]] = []
        weakref.finalize(self, remove, self._items)

    def append(self, tensor: torch.Tensor) -> None:
        self._items.append(save(tensor, self.folder))

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (load(*item) for item in self._items)

    def __len__(self) -> int:
        return len(self._items)


def remove(items: list) -> None:
    for path, _, _ in items:
        path.unlink(missing_ok=True)


class SpilledStats:
    """LayerStats whose xx [D+1, D+1] lives in a file, read on each access (the small rest in memory)."""

    def __init__(self, st: LayerStats, folder: Path):
        self._xx = save(st.xx, Path(folder))
        self.dist, self.rho, self.kappa, self.tokens = st.dist, st.rho, st.kappa, st.tokens

    @property
    def xx(self) -> torch.Tensor:
        return load(*self._xx)


def batch_store(folder: Path | None, activation_bytes: int):
    """A factory of containers for the calibration batches: lists, or DiskBatches past BUDGET."""
    if folder is None or activation_bytes <= BUDGET:
        return list
    return lambda: DiskBatches(folder)


def stats_keeper(folder: Path | None, stats_bytes: int):
    """What each layer's statistics become: themselves, or SpilledStats past BUDGET."""
    if folder is None or stats_bytes <= BUDGET:
        return lambda st: st
    return lambda st: SpilledStats(st, folder)
