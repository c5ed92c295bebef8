"""`LatentStore`: one model's blocks in a store directory, bounded by size with LRU eviction.

Layout (the file system is the index, so nothing is lost on a restart or a crash):

    DIR/.size                                 bytes of all block files (a ledger; fcntl-locked)
    DIR/<fingerprint>/model.json              what wrote these blocks (for `latentkv store ls`)
    DIR/<fingerprint>/blocks/<hh>/<hash>.safetensors
    DIR/<fingerprint>/tmp/<pid>-<thread>-<hash>.safetensors.tmp   writes in flight

Several processes may share DIR. Block files are immutable once renamed into place and
writes are atomic renames, so readers and writers need no lock: two writers of one block
write the same content and the last rename wins; a file deleted by another process's
eviction while we read it stays readable (POSIX), and one already gone is a miss. The size
bound is for the whole directory, across processes: after each write a writer adds its
bytes to the DIR/.size ledger under an exclusive `fcntl.flock`, and the one that takes it
past max_size evicts under the same lock, rescanning the real sizes (so a stale ledger
heals). LRU is by modification time: a hit touches its file.

A store that cannot be written (a read-only file system or directory, a full disk) but
holds blocks opens read-only: it serves what it holds and writes nothing (`read_only` says why).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from latentkv.store.files import (
    CorruptBlock,
    Place,
    StoredBlock,
    Unplaceable,
    encode,
    read_file,
    remove_dead_temps,
    write_atomic,
)

SUFFIX = ".safetensors"
LOW_WATER = 0.9  # eviction deletes down to this fraction of max_size, so it runs rarely
# errors that say "this directory cannot be written" (not "it is broken"): a store holding
# blocks then still serves them, read-only
UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


@dataclass
class StoreCounters:
    hits: int = 0  # blocks read back and served
    misses: int = 0  # lookups that found no usable block (absent, collision)
    bytes_read: int = 0
    bytes_written: int = 0
    write_drops: int = 0  # blocks not written: queue full, or the store stopped writing
    corrupt_blocks: int = 0  # files that failed to parse or verify (removed)
    evicted_blocks: int = 0


def block_files(root: Path):
    """(mtime, size, path) of every block file under `root` (all models)."""
    for path in root.glob(f"*/blocks/*/*{SUFFIX}"):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        yield st.st_mtime, st.st_size, path


def count_blocks(model_dir: Path) -> tuple[int, int, float]:
    """(block files, their bytes, newest mtime or 0) of one fingerprint's subdirectory."""
    count = nbytes = 0
    newest = 0.0
    for path in (model_dir / "blocks").glob(f"*/*{SUFFIX}"):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        count, nbytes, newest = count + 1, nbytes + st.st_size, max(newest, st.st_mtime)
    return count, nbytes, newest


def model_dirs(root: Path) -> list[Path]:
    """The fingerprint subdirectories of a store directory."""
    return sorted(d for d in Path(root).expanduser().glob("*") if d.is_dir() and (d / "blocks").is_dir())


class LatentStore:
    def __init__(self, root: str | Path, fingerprint: str, max_size: int, describe: dict | None = None):
        """Raises OSError when the directory cannot be created or written and holds no blocks
        of this model; opens read-only (`read_only`: the reason) when it cannot be written but does."""
        self.root = Path(root).expanduser()
        self.fingerprint = fingerprint
        self.max_size = max_size
        self.dir = self.root / fingerprint
        self.blocks_dir = self.dir / "blocks"
        self.tmp_dir = self.dir / "tmp"
        self.counters = StoreCounters()
        self.size = 0
        self.read_only = ""
        try:
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            self.blocks_dir.mkdir(exist_ok=True)
            probe = self.tmp_dir / f"{os.getpid()}-probe.tmp"
            probe.write_bytes(b"ok")  # fails now, clearly, if the directory is read-only
            probe.unlink()
            remove_dead_temps(self.tmp_dir)
            if describe is not None and not (self.dir / "model.json").exists():
                write_atomic(self.dir / "model.json", json.dumps(describe, indent=1).encode(), self.tmp_dir)
            self.add_size(0)
        except OSError as err:
            if err.errno not in UNWRITABLE or not self.blocks_dir.is_dir():
                raise
            self.read_only = err.strerror or str(err)
            self.size = self.read_size()

    def path(self, block_hash: bytes) -> Path:
        name = block_hash.hex()
        return self.blocks_dir / name[:2] / f"{name}{SUFFIX}"

    def num_blocks(self) -> int:
        return count_blocks(self.dir)[0]

    def contains(self, block_hash: bytes) -> bool:
        return self.path(block_hash).exists()

    def read(self, block_hash: bytes, parent_hash: bytes, token_ids: tuple) -> StoredBlock | None:
        """The block stored for `block_hash` if it is whole and holds exactly `token_ids`
        after `parent_hash`; else None (a miss). Corrupt files are counted and removed."""
        return self.read_chain([(block_hash, parent_hash, tuple(token_ids))])[0]

    def read_chain(
        self, wanted: list[tuple[bytes, bytes, tuple]], places: list[Place] | None = None
    ) -> list[StoredBlock | None]:
        """`read` for each (block hash, parent hash, token ids) of a prefix chain, in order; after
        the first miss the rest are None (a chain is served up to its first gap) and are not
        counted. With `places` (one per wanted block, files.read_block's `place`) each block's
        tensors are read straight to where its place puts them.
        In this thread, one file after another: a restore of 256 files from the page cache took
        65 ms so, 80 ms on two reader threads (2 cores: the per-file Python work holds the
        GIL, and the threads traded it back and forth)."""
        loaded = []
        for want, place in zip(wanted, places or [None] * len(wanted)):
            loaded.append(self.load(*want, place))
            if loaded[-1][0] is None:
                break
        out: list[StoredBlock | None] = []
        for block, status, nbytes in loaded:
            if status == "corrupt":
                self.counters.corrupt_blocks += 1
            if block is None:
                self.counters.misses += 1
                break
            self.counters.hits += 1
            self.counters.bytes_read += nbytes
            out.append(block)
        return out + [None] * (len(wanted) - len(out))

    def load(
        self, block_hash: bytes, parent_hash: bytes, token_ids: tuple, place: Place | None = None
    ) -> tuple[StoredBlock | None, str, int]:
        """One file read and verified, no counters touched (read_chain counts) ->
        (block or None, "hit" / "absent" / "corrupt" / "collision" / "unplaceable", bytes read).
        A corrupt file is removed; a hit's file is touched (LRU)."""
        path = self.path(block_hash)
        try:
            block, nbytes = read_file(path, place)
            if block.block_hash != block_hash:
                raise CorruptBlock(f"{path.name} holds block {block.block_hash.hex()}")
        except OSError:
            return None, "absent", 0
        except CorruptBlock:
            self.remove(path)
            return None, "corrupt", 0
        except Unplaceable:
            return None, "unplaceable", 0
        if block.parent_hash != parent_hash or block.token_ids != tuple(token_ids):
            return None, "collision", 0  # a hash collision: never served on the hash alone
        self.touch(path)
        return block, "hit", nbytes

    def write(self, block: StoredBlock) -> int:
        """Store `block` (atomically) unless it is there already; -> bytes written.
        Raises OSError (disk full, permissions, a read-only store) for the caller to handle."""
        if self.read_only:
            raise OSError(errno.EROFS, f"the store is read-only ({self.read_only})")
        path = self.path(block.block_hash)
        if path.exists():
            self.touch(path)
            return 0
        data = encode(block)
        # counted before the rename: a process killed between the two leaves the ledger too high
        # (eviction's rescan heals it), never too low, so crashes cannot take the directory past max_size
        self.add_size(len(data))
        try:
            try:
                write_atomic(path, data, self.tmp_dir)
            except FileNotFoundError:  # `latentkv store clear` ran meanwhile: start the folders again
                self.tmp_dir.mkdir(parents=True, exist_ok=True)
                write_atomic(path, data, self.tmp_dir)
        except OSError:
            self.add_size(-len(data))
            raise
        self.counters.bytes_written += len(data)
        return len(data)

    def add_size(self, nbytes: int) -> None:
        """Add `nbytes` (a file about to be written; negative: one that was not) to the directory's
        size ledger (a scan of the files there when it is missing or unreadable) and evict if that
        passes max_size, keeping room for them; all under the ledger's lock."""
        fd = os.open(self.root / ".size", os.O_RDWR | os.O_CREAT, 0o644)
        with open(fd, "r+") as ledger:
            fcntl.flock(ledger, fcntl.LOCK_EX)  # released when the file closes
            text = ledger.read().strip()
            on_disk = int(text) if text.isdigit() else sum(size for _, size, _ in block_files(self.root))
            total = max(0, on_disk + nbytes)
            if total > self.max_size:
                total = self.evict(max(nbytes, 0))
            ledger.seek(0)
            ledger.truncate()
            ledger.write(str(total))
            self.size = total

    def read_size(self) -> int:
        """The ledger's size, without writing it (a scan when it is missing or unreadable)."""
        try:
            text = (self.root / ".size").read_text().strip()
        except OSError:
            text = ""
        return int(text) if text.isdigit() else sum(size for _, size, _ in block_files(self.root))

    def evict(self, reserve: int = 0) -> int:
        """Delete least recently used block files (any model's) until the whole directory and
        `reserve` bytes about to be written are under LOW_WATER * max_size; -> bytes left plus
        `reserve`. Called with the ledger locked."""
        files = sorted(block_files(self.root))
        total = sum(size for _, size, _ in files) + reserve
        target = int(self.max_size * LOW_WATER)
        for _, size, path in files:
            if total <= target:
                break
            if self.remove(path):
                total -= size
                self.counters.evicted_blocks += 1
        return total

    @staticmethod
    def touch(path: Path) -> None:
        try:
            os.utime(path, (time.time(), time.time()))
        except OSError:
            pass  # evicted meanwhile, or a read-only store: LRU order is a hint only

    @staticmethod
    def remove(path: Path) -> bool:
        try:
            path.unlink()
            return True
        except OSError:
            return False
