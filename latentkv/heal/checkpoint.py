"""Healed checkpoints in the input's own format, and the training state for --resume.

The model folder keeps every non-weight file of the input (config, tokenizer, card);
weights are rewritten under the same names and dtype. The optimizer state goes to
safetensors and the counters to JSON — nothing is pickled.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..model.loader import checkpoint_tensors
from ..model.shards import weight_files

STATE_TENSORS = "optimizer.safetensors"
STATE_JSON = "state.json"


def input_dtype(folder: Path) -> torch.dtype:
    with safe_open(str(weight_files(folder)[0]), framework="pt") as f:
        return f.get_tensor(next(iter(f.keys()))).dtype


def save_model(model, source: Path, out: Path, dtype: torch.dtype) -> None:
    """Write `model`'s weights to `out` beside copies of `source`'s other files."""
    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and item.suffix != ".safetensors" and item.name != "model.safetensors.index.json":
            shutil.copy2(item, out / item.name)
    tensors = {
        name: t.to(torch.float32 if ".mlp.gate." in name else dtype).contiguous()
        for name, t in checkpoint_tensors(model).items()
    }
    for old in out.glob("*.safetensors"):
        old.unlink()
    (out / "model.safetensors.index.json").unlink(missing_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})


def save_state(out: Path, optimizer: torch.optim.Optimizer, counters: dict) -> None:
    """Optimizer moments and step counts (safetensors) + counters and history (JSON)."""
    state = optimizer.state_dict()
    tensors = {}
    for idx, per_param in state["state"].items():
        for key, value in per_param.items():
            tensors[f"{idx}.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / STATE_TENSORS))
    groups = [{k: v for k, v in g.items()} for g in state["param_groups"]]
    (out / STATE_JSON).write_text(json.dumps({"counters": counters, "param_groups": groups}, indent=1))


def load_state(folder: Path, optimizer: torch.optim.Optimizer) -> dict:
    """Restore optimizer state saved by save_state; returns the counters."""
    meta_path, tensor_path = folder / STATE_JSON, folder / STATE_TENSORS
    if not meta_path.exists() or not tensor_path.exists():
        raise FileNotFoundError(f"{folder}: no training state to resume from ({STATE_JSON}, {STATE_TENSORS})")
    meta = json.loads(meta_path.read_text())
    tensors = load_file(str(tensor_path))
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    return meta["counters"]
