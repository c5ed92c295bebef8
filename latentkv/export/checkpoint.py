"""A folder's safetensors read one decoder layer at a time, under the names and with the checks of
the loader (model/loader.py): storage variants normalized (fused experts, fp8 with block scales,
multi-token-prediction layers skipped), every tensor checked against the shape the config implies.

The expected names and shapes come from the model itself, built on the meta device (nothing
allocated), so the export and the loader agree on what a checkpoint holds.
"""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch

from latentkv.config import ModelConfig
from latentkv.model.loader import (LAYER_NAME, CheckpointError, checkpoint_slots, empty_model, open_safetensors,
                                   read_checked, slot_shape, weight_files)
from latentkv.model.route import Route


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of every tensor the config implies (lm_head left out when tied)."""
    model = empty_model(cfg, Route(), device="meta")
    params = dict(model.named_parameters(remove_duplicate=False))
    return {name: slot_shape(params[pname], rows) for name, (pname, rows) in checkpoint_slots(model).items()
            if not (cfg.tie_word_embeddings and name == "lm_head.weight")}


class CheckpointTensors:
    """`with CheckpointTensors(folder, cfg) as ckpt:` then `ckpt.top(name)` for a tensor outside
    the layers and `ckpt.layer(i)` for all of layer i's (a dict; only one layer is held at a time
    by the caller). Errors name the file and the tensor."""

    def __init__(self, folder: Path, cfg: ModelConfig):
        self.cfg, self.folder = cfg, Path(folder)
        self.expected = expected_shapes(cfg)
        self.stack = ExitStack()
        self.where: dict[int | None, list[tuple[Path, str]]] = {}  # layer (None: outside) -> stored keys
        self.keys: dict[Path, set[str]] = {}
        self.handles = {}
        for file in weight_files(self.folder):
            self.handles[file] = self.stack.enter_context(open_safetensors(file))
            self.keys[file] = set(self.handles[file].keys())
            for key in sorted(self.keys[file]):
                layer = LAYER_NAME.match(key)
                self.where.setdefault(int(layer.group(1)) if layer else None, []).append((file, key))

    def __enter__(self) -> "CheckpointTensors":
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    def stored_dtype(self, name: str) -> str:
        """The safetensors dtype of a stored tensor ("BF16", "F32", ...)."""
        for file, key in self.where.get(None, []):
            if key == name:
                return self.handles[file].get_slice(key).get_dtype()
        raise CheckpointError(f"missing tensor {name} in {self.folder}")

    def top(self, name: str) -> torch.Tensor:
        for file, key in self.where.get(None, []):
            if key == name:
                return self.checked(self.read(file, key), file, {name})[name]
        raise CheckpointError(f"missing tensor {name} (expected shape {self.expected[name]}) in {self.folder}")

    def layer(self, i: int) -> dict[str, torch.Tensor]:
        prefix = f"model.layers.{i}."
        want = {n for n in self.expected if n.startswith(prefix)}
        found: dict[str, torch.Tensor] = {}
        for file, key in self.where.get(i, []):
            found.update(self.checked(self.read(file, key), file, want))
        missing = sorted(want - set(found))
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise CheckpointError(f"missing tensor {missing[0]} (expected shape {self.expected[missing[0]]}){more} "
                                  f"in {self.folder}")
        return found

    def read(self, file: Path, key: str) -> dict[str, torch.Tensor]:
        return dict(read_checked(self.handles[file], key, self.keys[file], self.cfg, file))

    def checked(self, tensors: dict[str, torch.Tensor], file: Path, want: set[str]) -> dict[str, torch.Tensor]:
        """Keep the tensors in `want`; one the model has no place for, or of the wrong shape, is an error."""
        kept = {}
        for name, tensor in tensors.items():
            if self.cfg.tie_word_embeddings and name == "lm_head.weight":
                continue  # some tied checkpoints still carry a copy
            if name not in self.expected:
                raise CheckpointError(f"unexpected tensor {name} in {file} (shape {tuple(tensor.shape)}): "
                                      "not part of this model's config")
            if tuple(tensor.shape) != self.expected[name]:
                raise CheckpointError(f"tensor {name} in {file} has shape {tuple(tensor.shape)}; "
                                      f"the config expects {self.expected[name]}")
            if name in want:
                kept[name] = tensor
        return kept
