"""The model fingerprint that keys a store subdirectory: blocks written by one model,
conversion, weight quantization, compute dtype, cache dtype or block size are never read
by another.

Hashed: config.json's bytes, every weight file's name and size and its contents (files up
to FULL_HASH_LIMIT whole; bigger ones by their safetensors header plus SAMPLES evenly
spaced 1 MiB pieces, so a 600 GB checkpoint is fingerprinted in well under a second yet
two different healings of one conversion still differ), the compute dtype, cache dtype,
block size, weight quantization and STORE_VERSION.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

STORE_VERSION = 4  # 2: a quantized latent's rope key is bf16 for float32 models; 3: SHA-256 checksums; 4: XXH3-128
FULL_HASH_LIMIT = 256 * 2**20
PIECE = 2**20
SAMPLES = 16


def hash_file(path: Path, digest) -> None:
    size = path.stat().st_size
    digest.update(f"{path.name}:{size};".encode())
    with open(path, "rb") as f:
        if size <= FULL_HASH_LIMIT:
            for chunk in iter(lambda: f.read(PIECE), b""):
                digest.update(chunk)
            return
        header_len = int.from_bytes(f.read(8), "little")
        digest.update(f.read(min(header_len, FULL_HASH_LIMIT)))
        for i in range(SAMPLES):
            f.seek(size * i // SAMPLES)
            digest.update(f.read(PIECE))


@lru_cache(maxsize=16)
def weights_digest(folder: Path, stamps: tuple) -> bytes:
    """Digest of config.json and the weight files; `stamps` (names, sizes, mtimes) key the
    memo, so an engine restarted in the same process does not hash the weights again."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update((folder / "config.json").read_bytes())
    for weights in sorted(folder.glob("*.safetensors")):
        hash_file(weights, digest)
    return digest.digest()


def model_fingerprint(
    model_dir: str | Path, dtype: str, cache_dtype: str, block_size: int, quantization: str | None
) -> str:
    """-> 32 hex characters."""
    folder = Path(model_dir).resolve()
    stamps = tuple(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted([folder / "config.json", *folder.glob("*.safetensors")])
    )
    digest = hashlib.blake2b(weights_digest(folder, stamps), digest_size=16)
    digest.update(
        f"latentkv-store:{STORE_VERSION};dtype:{dtype};cache:{cache_dtype};block:{block_size};"
        f"quant:{quantization};".encode()
    )
    return digest.hexdigest()
