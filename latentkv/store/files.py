"""One block file: safetensors (never pickle) holding a full prefix-cache block's latents
for every layer, its token ids, and in the metadata its chained hash, parent hash and a
checksum over all of it.

Writes are atomic: the bytes go to a temp file in the store's `tmp/` folder (same file
system), then `os.replace` puts it under its final name, so a reader sees a whole file or
none. No fsync (a write-behind cache may lose its newest blocks in an OS crash; it must
not be slowed down by flushes): a file torn by a power loss fails its checksum, is
counted and removed, never served.

Reads parse the safetensors header and read each tensor's bytes straight into where they
go (`read_block`'s `place`: the engine's cache rows for a restore, one preadv per tensor),
then verify the checksum there: a restore copies every byte once, from the page cache into
the latent cache.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import xxhash
from safetensors.torch import save as save_bytes

TOKENS = "token_ids"
STALE_TEMP = 3600.0  # seconds after which any temp file is a leftover (remove_dead_temps)
MAX_HEADER = 1 << 20  # a block's header is a few KB; a larger length field is damage
DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I8": torch.int8,
    "U8": torch.uint8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "BOOL": torch.bool,
}

# place(name, dtype, shape) -> the writable buffers the named tensor's bytes fill, in order
# (together exactly its size), or None where this reader cannot hold it (Unplaceable)
Place = Callable[[str, torch.dtype, tuple], "list | None"]


class CorruptBlock(ValueError):
    """A block file that cannot be parsed or fails its checksum."""


class Unplaceable(ValueError):
    """A whole block file whose tensors do not fit where the reader would put them."""


@dataclass
class StoredBlock:
    """block_hash / parent_hash: 16-byte chained hashes; token_ids: block_size ints;
    tensors: per layer, that layer's cache tensors for this block (LatentCache.tensors()
    order, each [block_size, ...]); empty when read_block placed them elsewhere."""

    block_hash: bytes
    parent_hash: bytes
    token_ids: tuple
    tensors: list[list[torch.Tensor]]


def raw(t: torch.Tensor):
    """A contiguous tensor's bytes as a writable buffer (a uint8 array, no copy)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def checksum(tensors: dict[str, tuple[torch.dtype, tuple, list]], block_hash: bytes, parent_hash: bytes) -> str:
    """XXH3-128 over the hashes and every tensor's name, dtype, shape and bytes (each tensor as
    name -> (dtype, shape, the buffers its bytes are, in order)): it finds torn and damaged files
    at ~10 GB/s, where SHA-256 (~1.3 GB/s) was half of a restore's time. The store is no trust
    boundary (whoever can write it can write a matching checksum)."""
    digest = xxhash.xxh3_128(block_hash + parent_hash)
    for name in sorted(tensors):
        dtype, shape, buffers = tensors[name]
        digest.update(f"{name}:{dtype}:{tuple(shape)};".encode())
        for buffer in buffers:
            digest.update(buffer)
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


def layers_of(name: str, shape: tuple) -> list[tuple[int, int]]:
    """(layer, j) of each piece a packed tensor's name holds: `all.j` one per leading index."""
    where, j = name.split(".")
    return [(layer, int(j)) for layer in range(shape[0])] if where == "all" else [(int(where), int(j))]


def unpack(tensors: dict[str, torch.Tensor]) -> list[list[torch.Tensor]]:
    layers: dict[int, dict[int, torch.Tensor]] = {}
    for name, t in tensors.items():
        pieces = t.unbind(0) if name.startswith("all.") else [t]
        for (layer, j), view in zip(layers_of(name, tuple(t.shape)), pieces):
            layers.setdefault(layer, {})[j] = view
    if sorted(layers) != list(range(len(layers))) or any(sorted(d) != list(range(len(d))) for d in layers.values()):
        raise ValueError("the block's tensors do not cover every layer")
    return [[layers[i][j] for j in sorted(layers[i])] for i in sorted(layers)]


def encode(block: StoredBlock) -> bytes:
    tensors = pack(block.tensors)
    tensors[TOKENS] = torch.tensor(block.token_ids, dtype=torch.int64)
    meta = {
        "hash": block.block_hash.hex(),
        "parent": block.parent_hash.hex(),
        "checksum": checksum(
            {k: (t.dtype, tuple(t.shape), [raw(t.contiguous())]) for k, t in tensors.items()},
            block.block_hash,
            block.parent_hash,
        ),
    }
    return save_bytes(tensors, metadata=meta)


def read_block(
    read: Callable[[int, int], bytes], read_into: Callable[[int, list], int], size: int, place: Place | None = None
) -> StoredBlock:
    """Parse and verify one block file of `size` bytes through read(offset, n) -> bytes and
    read_into(offset, buffers) -> bytes read; raises CorruptBlock, or Unplaceable when `place`
    refuses a tensor. With `place`, the latents land where it says and the result's tensors are
    empty; without, in fresh tensors. The checksum is verified over the bytes where they landed
    (placed bytes of a block that fails are garbage there: the caller must not serve them)."""
    try:
        header_len = int.from_bytes(read(0, 8), "little")
        if not 0 < header_len <= min(MAX_HEADER, size - 8):
            raise ValueError("bad safetensors header length")
        header = json.loads(read(8, header_len))
        meta = header.pop("__metadata__", {})
        block_hash, parent = bytes.fromhex(meta["hash"]), bytes.fromhex(meta["parent"])
        fresh: dict[str, torch.Tensor] = {}
        pieces: dict[str, tuple] = {}
        for name in sorted(header):
            info = header[name]
            dtype, shape = DTYPES[info["dtype"]], tuple(int(d) for d in info["shape"])
            start, stop = (int(o) for o in info["data_offsets"])
            nbytes = torch.Size(shape).numel() * dtype.itemsize
            if start < 0 or stop - start != nbytes or 8 + header_len + stop > size:
                raise ValueError(f"tensor {name} does not lie within the file")
            buffers = place(name, dtype, shape) if place is not None and name != TOKENS else None
            if buffers is None:
                if place is not None and name != TOKENS:
                    raise Unplaceable(f"tensor {name} {dtype} {shape} does not fit this cache")
                fresh[name] = torch.empty(shape, dtype=dtype)
                buffers = [raw(fresh[name])]
            if read_into(8 + header_len + start, buffers) != nbytes:
                raise ValueError(f"tensor {name} is cut short")
            pieces[name] = (dtype, shape, buffers)
        if TOKENS not in fresh or checksum(pieces, block_hash, parent) != meta.get("checksum"):
            raise CorruptBlock("block file fails its checksum")
        token_ids = tuple(fresh.pop(TOKENS).tolist())
        per_layer = unpack(fresh) if place is None else []
    except (KeyError, ValueError, TypeError, AttributeError, RuntimeError, OverflowError) as err:
        if isinstance(err, (CorruptBlock, Unplaceable)):
            raise
        raise CorruptBlock(f"unreadable block file: {err}") from None
    return StoredBlock(block_hash, parent, token_ids, per_layer)


def decode(data: bytes) -> StoredBlock:
    """Parse and verify a block file's bytes; raises CorruptBlock."""
    view = memoryview(data)

    def read_into(offset: int, buffers: list) -> int:
        done = 0
        for buf in buffers:
            piece = view[offset + done : offset + done + len(buf)]
            buf[: len(piece)] = piece
            done += len(piece)
        return done

    return read_block(lambda offset, n: bytes(view[offset : offset + n]), read_into, len(data))


def read_file(path: Path, place: Place | None = None) -> tuple[StoredBlock, int]:
    """read_block on a file (pread / preadv: each tensor in one call) -> (block, file size).
    Raises OSError (absent, unreadable), CorruptBlock, Unplaceable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        return read_block(
            lambda offset, n: os.pread(fd, n, offset),
            lambda offset, buffers: os.preadv(fd, buffers, offset),
            size,
            place,
        ), size
    finally:
        os.close(fd)


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


def remove_dead_temps(tmp_dir: Path, stale_after: float = STALE_TEMP) -> int:
    """Delete temp files whose writer process is gone (killed mid-write), or older than
    `stale_after` seconds whoever wrote them (a block's write takes milliseconds: an old one is a
    dead writer's whose pid was reused, or was another pid namespace's); -> how many."""
    removed = 0
    now = time.time()
    for tmp in tmp_dir.glob("*.tmp"):
        pid = tmp.name.split("-", 1)[0]
        try:
            fresh = now - tmp.stat().st_mtime < stale_after
        except FileNotFoundError:
            continue  # renamed into place meanwhile
        if fresh and pid.isdigit() and pid_alive(int(pid)):
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
