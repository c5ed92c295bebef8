"""`StoreTier`: the store as the prefix cache's second tier, bound to one engine's block
pool and latent caches.

- `save`: a block just became full, computed and registered in RAM -> copy its latents
  (all layers) to CPU and hand them to the write-behind queue.
- `restore`: a prefix lookup missed in RAM -> take free blocks for the following blocks
  on disk, read each file straight into its block's cache rows, verify them there and
  register them, so the request's admission sees them as ordinary cached
  blocks and skips their prefill.
"""

from __future__ import annotations

import sys
from collections import OrderedDict

import torch

from latentkv.cache.block_pool import NO_HASH, BlockPool
from latentkv.facts import dtype_name
from latentkv.store.files import StoredBlock, layers_of
from latentkv.store.fingerprint import STORE_VERSION, model_fingerprint
from latentkv.store.store import LatentStore
from latentkv.store.writer import FlushReport, WriteBehind


def warn(message: str) -> None:
    print(f"latentkv: warning: {message}", file=sys.stderr, flush=True)


class Recent:
    """The last `capacity` block hashes this process queued for writing or read back, oldest first out:
    a bounded memory of what is probably on disk already (a server's lifetime of blocks is not)."""

    def __init__(self, capacity: int = 1 << 16):
        self.capacity = capacity
        self.hashes: OrderedDict[bytes, None] = OrderedDict()

    def add(self, block_hash: bytes) -> None:
        self.hashes[block_hash] = None
        self.hashes.move_to_end(block_hash)
        if len(self.hashes) > self.capacity:
            self.hashes.popitem(last=False)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.hashes

    def __len__(self) -> int:
        return len(self.hashes)


class StoreTier:
    def __init__(self, store: LatentStore, caches: list, pool: BlockPool, max_pending: int = 1024):
        self.store = store
        self.caches = caches
        self.pool = pool
        self.block_size = pool.block_size
        self.writer = WriteBehind(store, max_pending, failed=store.read_only)
        self.recent = Recent()  # hashes queued or read by this process: skip re-writing them
        self.rows = block_rows(caches)

    def on_disk(self, block_hash: bytes) -> bool:
        """Whether a block need not be written again: this process wrote or read it and its file is still
        there (the size bound, or another process sharing the directory, may have evicted it since)."""
        return block_hash in self.recent and self.store.contains(block_hash)

    @property
    def counters(self):
        return self.store.counters

    # -- RAM -> disk -------------------------------------------------------------------
    def save(self, blocks: list[tuple[int, bytes, tuple, bytes]]) -> None:
        """Queue (block id, parent hash, token ids, block hash) blocks for writing. Their
        latents are copied now (one gather per cache tensor), before the blocks can change."""
        blocks = [b for b in blocks if not self.on_disk(b[3])]
        if not blocks:
            return
        if self.writer.failed:  # a read-only or failed store: no copy for nothing, a drop each
            for _ in blocks:
                self.writer.drop()
            return
        for b in blocks:
            self.recent.add(b[3])
        index = torch.tensor([b[0] for b in blocks], device=self.caches[0].tensors()[0].device)
        gathered = [[t.index_select(0, index).cpu() for t in cache.tensors()] for cache in self.caches]
        for i, (_, parent, tokens, block_hash) in enumerate(blocks):
            tensors = [[t[i] for t in layer] for layer in gathered]
            self.writer.submit(StoredBlock(block_hash, parent, tuple(tokens), tensors))

    # -- disk -> RAM -------------------------------------------------------------------
    def restore(self, block_hashes: list[bytes], token_ids: list[int], hits: list[int]) -> list[int]:
        """Block ids of the blocks after the RAM `hits` restored from disk (maybe none).
        Reads only as many blocks as the pool has free; stops at the first miss."""
        bs = self.block_size
        room = self.pool.num_free - self.pool.count_revived(hits)
        wanted = [
            (block_hashes[i], block_hashes[i - 1] if i else NO_HASH, tuple(token_ids[i * bs : (i + 1) * bs]))
            for i in range(len(hits), min(len(block_hashes), len(hits) + max(room, 0)))
        ]
        present = 0  # files there up to the first gap (a stat each): blocks are taken only for them
        while present < len(wanted) and self.store.contains(wanted[present][0]):
            present += 1
        if not present:
            if wanted:
                self.store.counters.misses += 1
            return []
        self.pool.take(hits)  # so allocating cannot evict the RAM hits themselves
        ids = self.pool.allocate(present)
        slots = [CacheSlots(self.rows, block_id) for block_id in ids]
        served = []
        for block_id, block, slot in zip(ids, self.store.read_chain(wanted[:present], slots), slots):
            if block is None or not slot.complete():
                break  # this block's rows may hold a failed read: it stays unregistered
            self.pool.register(block_id, block.parent_hash, block.token_ids, block.block_hash)
            self.recent.add(block.block_hash)
            served.append(block_id)
        if len(served) == present < len(wanted):
            self.store.counters.misses += 1  # the gap the stats found (a failed read counted its own)
        self.pool.free(list(reversed(ids)) + list(reversed(hits)))
        return served

    def close(self, timeout: float = 30.0) -> FlushReport:
        """Write the queue out (within `timeout` seconds; the rest is dropped) and stop writing."""
        return self.writer.close(timeout)

    def describe(self) -> str:
        return (
            f"KV store {self.store.root} ({self.store.size / 2**20:.1f} MiB of "
            f"{self.store.max_size / 2**20:.0f} MiB): {self.store.num_blocks()} blocks usable by this model "
            f"(fingerprint {self.store.fingerprint[:12]})" + (", read-only" if self.store.read_only else "")
        )


def open_tier(args, model_dtype: torch.dtype, caches: list, pool: BlockPool) -> StoreTier | None:
    """The engine's store tier for `args.kv_store`, or None (off, or unusable: one warning)."""
    if not args.kv_store:
        return None
    if not pool.enable_prefix_caching:
        warn(f"the KV store {args.kv_store} needs prefix caching, which is off; running without the store")
        return None
    dtype = dtype_name(model_dtype)
    fingerprint = model_fingerprint(args.model, dtype, args.kv_cache_dtype, args.block_size, args.quantization)
    describe = {
        "model": str(args.model),
        "dtype": dtype,
        "kv_cache_dtype": args.kv_cache_dtype,
        "block_size": args.block_size,
        "quantization": args.quantization,
        "store_version": STORE_VERSION,
    }
    try:
        store = LatentStore(args.kv_store, fingerprint, args.kv_store_max_size, describe)
    except OSError as err:
        warn(f"the KV store {args.kv_store} is not usable ({err}); running without it")
        return None
    if store.read_only:
        warn(
            f"the KV store {args.kv_store} cannot be written ({store.read_only}); serving the blocks it holds "
            "without writing new ones"
        )
    return StoreTier(store, caches, pool)


def block_rows(caches: list) -> list[list[tuple]]:
    """Per layer, per cache tensor: (dtype, one block's shape, the tensor's bytes as a
    [blocks, bytes per block] uint8 array, a view): what CacheSlots hands the reader, made once."""
    return [
        [(t.dtype, tuple(t.shape[1:]), t.view(t.shape[0], -1).view(torch.uint8).numpy()) for t in cache.tensors()]
        for cache in caches
    ]


class CacheSlots:
    """files.read_block's `place` for one block of the engine's caches: a stored tensor's pieces
    are that block's rows of each (layer, j) it holds (block_rows), when dtype and shape match;
    records which it filled."""

    def __init__(self, rows: list[list[tuple]], block_id: int):
        self.rows, self.block_id = rows, block_id
        self.filled: set[tuple[int, int]] = set()

    def __call__(self, name: str, dtype: torch.dtype, shape: tuple) -> list | None:
        try:
            pieces = layers_of(name, shape)
        except (ValueError, IndexError):
            return None
        piece_shape = tuple(shape[1:] if name.startswith("all.") else shape)
        buffers = []
        for layer, j in pieces:
            kinds = self.rows[layer] if 0 <= layer < len(self.rows) else []
            if not 0 <= j < len(kinds) or kinds[j][:2] != (dtype, piece_shape):
                return None
            buffers.append(kinds[j][2][self.block_id])
        self.filled.update(pieces)
        return buffers

    def complete(self) -> bool:
        """Every cache tensor of every layer filled (the fingerprint makes this so; checked so a
        stray file can never leave a block half written)."""
        return len(self.filled) == sum(len(kinds) for kinds in self.rows)
