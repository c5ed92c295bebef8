"""A folder's safetensors shards, read one tensor at a time (for the loader, model/loader.py, and
the readers that go a layer at a time: export/checkpoint.py, convert/layerwise.py).

Safetensors only: pickled `.bin`/`.pt` weights are refused, never unpickled; a file or tensor that
cannot be read is an error naming it. DeepSeek's own checkpoints are accepted as published: fp8
weights with `weight_scale_inv` block scales are dequantized, and the multi-token-prediction layers
past `num_hidden_layers` are skipped (the family's checkpoint names, model/families.py). Each tensor
is read through its own mapping of the shard, dropped once copied, so a shard's pages do not stay
resident (safetensors maps the file, and get_tensor returns views of the mapping).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm.auto import tqdm

from ..config import ModelConfig
from .families import DEEPSEEK_NAMES, family

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")
FP8_BLOCK = 128


class CheckpointError(ValueError):
    """A checkpoint that does not match its config; the message names file and tensor."""


def weight_files(folder: Path) -> list[Path]:
    """The safetensors shards of a folder (from the index when there is one)."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(
                f'{index}: not a safetensors index (needs a "weight_map" object): {type(err).__name__}: {err}'
            ) from None
        missing = [s for s in shards if not (folder / s).exists()]
        if missing:
            raise CheckpointError(f"{index}: lists shard {missing[0]} which is not in {folder}")
        return [folder / s for s in shards]
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise CheckpointError(
            f"{folder}: only pickled weights ({', '.join(pickled)}); latentkv loads safetensors only "
            "and never unpickles "
            "(convert them with a tool you trust, e.g. transformers' save_pretrained(safe_serialization=True))"
        )
    raise CheckpointError(f"{folder}: no *.safetensors weight files")


def file_tensors(files: list[Path], cfg: ModelConfig, bar: tqdm | None = None):
    """Yield (checkpoint name, tensor, file) of every tensor of the shards. Each tensor is read
    through its own mapping of the file, unmapped once the tensor is dropped (a mapping kept open
    over a whole shard kept every page read resident: a shard's size on top of the model)."""
    for file in files:
        with open_safetensors(file) as f:
            names = set(f.keys())
            sizes = {name: stored_bytes(f.get_slice(name)) for name in names} if bar is not None else {}
        for name in sorted(names):
            with open_safetensors(file) as f:
                for target, tensor in read_checked(f, name, names, cfg, file):
                    yield target, tensor, file
            if bar is not None:
                bar.update(sizes[name])


def stored_bytes(tensor_slice) -> int:
    """A stored tensor's bytes from its header: the format's dtype names carry their bit width
    (BF16, F8_E4M3, U8); BOOL takes a byte."""
    dtype = tensor_slice.get_dtype()
    bits = 8 if dtype == "BOOL" else int(re.search(r"\d+", dtype).group())
    numel = 1
    for n in tensor_slice.get_shape():
        numel *= n
    return numel * bits // 8


def open_safetensors(file: Path):
    """safe_open, with a truncated, empty or foreign file reported as a CheckpointError naming it."""
    if file.stat().st_size == 0:
        raise CheckpointError(f"{file}: the file is empty (0 bytes); not a safetensors file")
    try:
        return safe_open(str(file), framework="pt")
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types
        raise CheckpointError(
            f"{file}: cannot read it as safetensors ({type(err).__name__}: {err}); "
            "is it truncated or not a safetensors file?"
        ) from None


def read_checked(f, name: str, names: set[str], cfg: ModelConfig, file: Path):
    """`read_tensor`, with a tensor whose bytes cannot be read reported as file + tensor."""
    try:
        yield from read_tensor(f, name, names, cfg)
    except CheckpointError:
        raise
    except Exception as err:  # noqa: BLE001 - e.g. data past the end of a truncated file
        raise CheckpointError(f"{file}: cannot read tensor {name} ({type(err).__name__}: {err})") from None


LAYER_NAME = DEEPSEEK_NAMES.layer  # a decoder layer's tensor; group 1: its index (export/checkpoint.py)


def read_tensor(f, name: str, names: set[str], cfg: ModelConfig):
    """Yield (parameter name, tensor) for one stored tensor; normalizes storage variants (the
    family's checkpoint names, model/families.py)."""
    names_of = family(cfg.model_type).checkpoint
    if name.endswith(names_of.skip_suffixes):
        return
    layer = names_of.layer.match(name)
    if layer and int(layer.group(1)) >= cfg.num_hidden_layers:
        return  # multi-token-prediction layers: not part of next-token inference
    tensor = f.get_tensor(name)
    if tensor.dtype == torch.float8_e4m3fn:
        tensor = dequantize_fp8(tensor, f, name, names)
    fused = names_of.fused_experts.match(name) if names_of.fused_experts else None
    if fused is None:
        yield name, tensor
        return
    prefix, kind = fused.groups()
    for e in range(tensor.shape[0]):
        if kind == "down_proj":
            yield f"{prefix}.{e}.down_proj.weight", tensor[e]
        else:
            gate, up = tensor[e].chunk(2, dim=0)
            yield f"{prefix}.{e}.gate_proj.weight", gate
            yield f"{prefix}.{e}.up_proj.weight", up


def dequantize_fp8(weight: torch.Tensor, f, name: str, names: set[str]) -> torch.Tensor:
    """DeepSeek-V3's fp8 checkpoints: one float32 scale per 128x128 block."""
    scale_name = name.removesuffix(".weight") + ".weight_scale_inv"
    if scale_name not in names:
        raise CheckpointError(f"{name} is float8 but {scale_name} is missing in the same file")
    scale = f.get_tensor(scale_name).float()
    rows, cols = weight.shape
    full = scale.repeat_interleave(FP8_BLOCK, 0).repeat_interleave(FP8_BLOCK, 1)[:rows, :cols]
    return weight.float() * full
