"""A folder's safetensors read one decoder layer at a time, under the names and with the checks of
the loader (model/loader.py, model/shards.py): storage variants normalized (fused experts, fp8 with block scales,
multi-token-prediction layers skipped), every tensor checked against the shape the config implies.

The expected names and shapes come from the model itself, built on the meta device (nothing
allocated), so the export and the loader agree on what a checkpoint holds.
"""

from __future__ import annotations

from pathlib import Path

import torch

from latentkv.config import ModelConfig
from latentkv.model.loader import checkpoint_slots, empty_model, slot_shape
from latentkv.model.route import Route
from latentkv.model.shards import LAYER_NAME, CheckpointError, open_safetensors, read_checked, weight_files


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape of every tensor the config implies (lm_head left out when tied)."""
    model = empty_model(cfg, Route(), device="meta")
    params = dict(model.named_parameters(remove_duplicate=False))
    return {
        name: slot_shape(params[pname], rows)
        for name, (pname, rows) in checkpoint_slots(model).items()
        if not (cfg.tie_word_embeddings and name == "lm_head.weight")
    }


class CheckpointTensors:
    """`ckpt.top(name)` for a tensor outside the layers, `ckpt.layer(i)` for all of layer i's (a dict;
    the caller holds one layer at a time). Each read opens the shards it needs and closes them after:
    safetensors maps a file, and pages read through a mapping stay resident while it is open.
    Errors name the file and the tensor."""

    def __init__(self, folder: Path, cfg: ModelConfig):
        self.cfg, self.folder = cfg, Path(folder)
        self.expected = expected_shapes(cfg)
        self.where: dict[int | None, dict[Path, list[str]]] = {}  # layer (None: outside) -> file -> stored keys
        self.keys: dict[Path, set[str]] = {}
        for file in weight_files(self.folder):
            with open_safetensors(file) as f:
                self.keys[file] = set(f.keys())
            for key in sorted(self.keys[file]):
                layer = LAYER_NAME.match(key)
                self.where.setdefault(int(layer.group(1)) if layer else None, {}).setdefault(file, []).append(key)

    def stored_dtype(self, name: str) -> str:
        """The safetensors dtype of a stored tensor outside the layers ("BF16", "F32", ...)."""
        file = self.file_of(name)
        with open_safetensors(file) as f:
            return f.get_slice(name).get_dtype()

    def top(self, name: str) -> torch.Tensor:
        file = self.file_of(name)
        return self.read(file, [name], {name})[name]

    def layer(self, i: int) -> dict[str, torch.Tensor]:
        prefix = f"model.layers.{i}."
        want = {n for n in self.expected if n.startswith(prefix)}
        found: dict[str, torch.Tensor] = {}
        for file, keys in self.where.get(i, {}).items():
            found.update(self.read(file, keys, want))
        missing = sorted(want - set(found))
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise CheckpointError(
                f"missing tensor {missing[0]} (expected shape {self.expected[missing[0]]}){more} in {self.folder}"
            )
        return found

    def file_of(self, name: str) -> Path:
        for file, keys in self.where.get(None, {}).items():
            if name in keys:
                return file
        shape = f" (expected shape {self.expected[name]})" if name in self.expected else ""
        raise CheckpointError(f"missing tensor {name}{shape} in {self.folder}")

    def read(self, file: Path, keys: list[str], want: set[str]) -> dict[str, torch.Tensor]:
        """Read `keys` of `file` (normalized and checked as the loader does); keep those in `want`."""
        kept = {}
        with open_safetensors(file) as f:
            for key in keys:
                kept.update(self.checked(dict(read_checked(f, key, self.keys[file], self.cfg, file)), file, want))
        return kept

    def checked(self, tensors: dict[str, torch.Tensor], file: Path, want: set[str]) -> dict[str, torch.Tensor]:
        """Keep the tensors in `want`; one the model has no place for, or of the wrong shape, is an error."""
        kept = {}
        for name, tensor in tensors.items():
            if self.cfg.tie_word_embeddings and name == "lm_head.weight":
                continue  # some tied checkpoints still carry a copy
            if name not in self.expected:
                raise CheckpointError(
                    f"unexpected tensor {name} in {file} (shape {tuple(tensor.shape)}): not part of this model's config"
                )
            if tuple(tensor.shape) != self.expected[name]:
                raise CheckpointError(
                    f"tensor {name} in {file} has shape {tuple(tensor.shape)}; the config expects {self.expected[name]}"
                )
            if name in want:
                kept[name] = tensor
        return kept
