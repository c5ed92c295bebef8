"""`export_gguf`: a DeepSeek-V2/V3 Hugging Face folder as a llama.cpp `deepseek2` GGUF file.

Streamed: the header (metadata, tokenizer, every tensor's name, shape and type) is planned from the
config alone, by running the tensor layout (gguf_tensors.py) on meta tensors; the weights are then
read, transformed, encoded and written one decoder layer at a time, so a 236B model needs about
one layer in memory. The file is written beside `out` and renamed into place when complete.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import torch
from tqdm.auto import tqdm

from latentkv.config import ModelConfig
from latentkv.export.checkpoint import CheckpointTensors
from latentkv.export.gguf_check import ExportError, check_representable
from latentkv.export.gguf_metadata import ARCH, add_hparams
from latentkv.export.gguf_tensors import FILE_TYPES, OUTTYPES, byte_shape, encode, model_tensors, tensor_type
from latentkv.export.gguf_vocab import add_vocab
from latentkv.model.shards import CheckpointError

OUTTYPE_CHOICES = (*OUTTYPES, "auto")
# "auto": the folder's own precision (fp8 checkpoints, dequantized on reading, become bf16)
AUTO = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F8_E4M3": "bf16"}


def export_gguf(folder: Path, out: Path, outtype: str = "auto", tokenizer_pre: str | None = None) -> Path:
    """Write `folder` (config.json model_type deepseek_v2 / deepseek_v3, safetensors, tokenizer.json)
    as the GGUF file `out` for llama.cpp's deepseek2 architecture; returns `out`.

    outtype: f32 / f16 / bf16 keep values (cast); q8_0 / q4_0 / q4_1 quantize the 2-D and expert
    weights with gguf.quants (see gguf_tensors.tensor_type for what stays float); "auto": the
    folder's dtype. tokenizer_pre: llama.cpp's pre-tokenizer name (None: detected, gguf_vocab.py).
    Raises ExportError (what llama.cpp cannot represent, a bad option), CheckpointError or ConfigError."""
    folder, out = Path(folder), Path(out)
    if outtype not in OUTTYPE_CHOICES:
        raise ExportError(f"outtype {outtype!r} is not one of {', '.join(OUTTYPE_CHOICES)}")
    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: no config.json (is this a Hugging Face model folder?)")
    cfg = ModelConfig.from_file(folder / "config.json")
    check_representable(cfg, str(folder))
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    ckpt = CheckpointTensors(folder, cfg)
    base = OUTTYPES[resolve_outtype(outtype, ckpt)]
    writer = gguf.GGUFWriter(str(partial), ARCH)  # the file is opened by write_header_to_file
    add_hparams(writer, cfg, folder.name, FILE_TYPES[base])
    add_vocab(writer, folder, cfg.vocab_size, tokenizer_pre)
    total = plan(writer, cfg, base, ckpt.expected)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        write_tensors(writer, cfg, ckpt, base, total)
        writer.close()
        os.replace(partial, out)
    finally:
        writer.close()
        partial.unlink(missing_ok=True)
    return out


def resolve_outtype(outtype: str, ckpt: CheckpointTensors) -> str:
    if outtype != "auto":
        return outtype
    stored = ckpt.stored_dtype("model.embed_tokens.weight")
    if stored not in AUTO:
        raise ExportError(f"{ckpt.folder}: weights stored as {stored}; pick --outtype ({', '.join(OUTTYPES)})")
    return AUTO[stored]


def plan(
    writer: gguf.GGUFWriter, cfg: ModelConfig, base: gguf.GGMLQuantizationType, shapes: dict[str, tuple[int, ...]]
) -> int:
    """Add every tensor's info (name, shape, type, bytes) from meta tensors of the checkpoint's
    `shapes` (checkpoint.expected_shapes); returns the total bytes."""

    def meta(name: str) -> torch.Tensor:
        return torch.empty(shapes[name], device="meta")

    total = 0
    for name, kind, tensor in model_tensors(cfg, meta, lambda i: meta):
        shape = tuple(tensor.shape)
        qtype = tensor_type(kind, shape, base)
        stored = byte_shape(shape, qtype)  # bytes per row: the writer derives the shape from them
        nbytes = int(np.prod(stored))
        writer.add_tensor_info(name, stored, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
        total += nbytes
    return total


def write_tensors(
    writer: gguf.GGUFWriter, cfg: ModelConfig, ckpt: CheckpointTensors, base: gguf.GGMLQuantizationType, total: int
) -> None:
    """Read, transform, encode and write every tensor in the planned order, one layer held at a time."""
    with tqdm(total=total, unit="B", unit_scale=True, desc="export gguf") as bar:
        for name, kind, tensor in model_tensors(cfg, ckpt.top, lambda i: ckpt.layer(i).__getitem__):
            data = encode(tensor, tensor_type(kind, tuple(tensor.shape), base))
            writer.write_tensor_data(data)
            bar.update(data.nbytes)
            bar.set_postfix_str(name, refresh=False)
