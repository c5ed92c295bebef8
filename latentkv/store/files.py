"""One block file: safetensors (never pickle) holding a full prefix-cache block's latents
for every layer, its token ids, and in the metadata its chained hash, parent hash and a
checksum over all of it.

Writes are atomic: the bytes go to a temp file in the store's `tmp/` folder (same file
system), then `os.replace` puts it under its final name, so a reader sees a whole file or
none. No fsync (a write-behind cache may lose its newest blocks in an OS crash; it must
not be slowed down by flushes): a file torn by a power loss fails its checksum, is
counted and removed, never served.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

TOKENS = "token_ids"


class CorruptBlock(ValueError):
    """A block file that cannot be parsed or fails its checksum."""


@dataclass
class StoredBlock:
    """block_hash / parent_hash: 16-byte chained hashes; token_ids: block_size ints;
    tensors: per layer, that layer's cache tensors for this block (LatentCache.tensors()
    order, each [block_size, ...])."""
    block_hash: bytes
    parent_hash: bytes
    token_ids: tuple
    tensors: list[list[torch.Tensor]]


def checksum(tensors: dict[str, torch.Tensor], block_hash: bytes, parent_hash: bytes) -> str:
    """SHA-256 over the hashes and every tensor's name, dtype, shape and bytes: CPUs with SHA
    instructions (x86 sha_ni, Arm) hash ~3x faster than blake2b, and a restore hashes every
    byte it reads."""
    digest = hashlib.sha256(block_hash + parent_hash)
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        if t.numel():
            digest.update(t.view(torch.uint8).numpy())   # the buffer itself, no copy
    return digest.hexdigest()


def pack(per_layer: list[list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per-layer tensors -> named tensors: `all.j` [layers, ...] when every layer's j-th
    tensor has one shape and dtype (one tensor per kind: fast to write and read), else
    `<layer>.j` (per-layer ranks)."""
    out = {}
    for j in range(max(len(ts) for ts in per_layer)):
        kind = [(layer, ts[j]) for layer, ts in enumerate(per_layer) if j < len(ts)]
        first = kind[0][1]
        if len(kind) == len(per_layer) and all(t.shape == first.shape and t.dtype == first.dtype for _, t in kind):
            out[f"all.{j}"] = torch.stack([t for _, t in kind])
        else:
            out.update({f"{layer}.{j}": t.contiguous() for layer, t in kind})
    return out


def unpack(tensors: dict[str, torch.Tensor]) -> list[list[torch.Tensor]]:
    layers: dict[int, dict[int, torch.Tensor]] = {}
    for name, t in tensors.items():
        where, j = name.split(".")
        if where == "all":
            for layer, view in enumerate(t.unbind(0)):
                layers.setdefault(layer, {})[int(j)] = view
        else:
            layers.setdefault(int(where), {})[int(j)] = t
    if sorted(layers) != list(range(len(layers))) or any(sorted(d) != list(range(len(d))) for d in layers.values()):
        raise ValueError("the block's tensors do not cover every layer")
    return [[layers[i][j] for j in sorted(layers[i])] for i in sorted(layers)]


def encode(block: StoredBlock) -> bytes:
    tensors = pack(block.tensors)
    tensors[TOKENS] = torch.tensor(block.token_ids, dtype=torch.int64)
    meta = {"hash": block.block_hash.hex(), "parent": block.parent_hash.hex(),
            "checksum": checksum(tensors, block.block_hash, block.parent_hash)}
    return save_bytes(tensors, metadata=meta)


def decode(data: bytes) -> StoredBlock:
    """Parse and verify a block file's bytes; raises CorruptBlock."""
    try:
        tensors = load_bytes(data)
        meta = read_metadata(data)
        block_hash, parent = bytes.fromhex(meta["hash"]), bytes.fromhex(meta["parent"])
        if TOKENS not in tensors or checksum(tensors, block_hash, parent) != meta.get("checksum"):
            raise CorruptBlock("block file fails its checksum")
        token_ids = tuple(tensors.pop(TOKENS).tolist())
        per_layer = unpack(tensors)
    except (SafetensorError, KeyError, ValueError, TypeError, RuntimeError) as err:
        if isinstance(err, CorruptBlock):
            raise
        raise CorruptBlock(f"unreadable block file: {err}") from None
    return StoredBlock(block_hash, parent, token_ids, per_layer)


def read_metadata(data: bytes) -> dict:
    header_len = int.from_bytes(data[:8], "little")
    if header_len <= 0 or 8 + header_len > len(data):
        raise ValueError("bad safetensors header length")
    return json.loads(data[8:8 + header_len]).get("__metadata__", {})


def write_atomic(path: Path, data: bytes, tmp_dir: Path) -> None:
    """Write `data` to `path` via a temp file in `tmp_dir` (same file system) + rename.
    The temp name carries our pid, so a dead writer's leftovers can be recognised, and the
    thread's id, so two engines of one process writing the same block do not share it."""
    tmp = tmp_dir / f"{os.getpid()}-{threading.get_ident()}-{path.name}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_dead_temps(tmp_dir: Path) -> int:
    """Delete temp files whose writer process is gone (killed mid-write); -> how many."""
    removed = 0
    for tmp in tmp_dir.glob("*.tmp"):
        pid = tmp.name.split("-", 1)[0]
        if pid.isdigit() and pid_alive(int(pid)):
            continue
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
