"""The user cache directory and content hashes of model files (shared by the conversion
cache in resolve.py and the chat-answer cache in sources/chat_data.py)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def cache_root() -> Path:
    """$LATENTKV_CACHE_DIR, else $XDG_CACHE_HOME/latentkv, else ~/.cache/latentkv."""
    if os.environ.get("LATENTKV_CACHE_DIR"):
        return Path(os.environ["LATENTKV_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "latentkv"


def source_files(source: Path) -> list[Path]:
    """The files whose bytes define a source: the GGUF, or the folder's files (sorted)."""
    if source.is_file():
        return [source]
    return sorted(p for p in source.rglob("*") if p.is_file() and not p.name.startswith("."))


def content_hash(source: Path) -> str:
    """sha256 (64 hex) over the source's files (names and bytes). Hashes of unchanged files (same
    size and mtime) are remembered in the cache dir, so a second start reads nothing big."""
    source = Path(source)
    memo_file = cache_root() / "hashes.json"
    try:
        memo = json.loads(memo_file.read_text())
    except (OSError, ValueError):
        memo = {}
    digest = hashlib.sha256()
    changed = False
    for f in source_files(source):
        stat = f.stat()
        memo_key = f"{f.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
        if memo_key not in memo:
            memo[memo_key] = file_sha256(f)
            changed = True
        digest.update(f.relative_to(source).as_posix().encode() if source.is_dir() else b"")
        digest.update(memo[memo_key].encode())
    if changed:
        memo_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_file.with_name(f"hashes.json.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(memo))
        tmp.replace(memo_file)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
