"""`StoreTier`: the store as the prefix cache's second tier, bound to one engine's block
pool and latent caches.

- `save`: a block just became full, computed and registered in RAM -> copy its latents
  (all layers) to CPU and hand them to the write-behind queue.
- `restore`: a prefix lookup missed in RAM -> read the following blocks from disk while
  they verify, place them in free blocks and register them, so the request's admission
  sees them as ordinary cached blocks and skips their prefill.
"""
from __future__ import annotations

import sys

import torch

from latentkv.cache.block_pool import NO_HASH, BlockPool
from latentkv.facts import dtype_name
from latentkv.store.files import StoredBlock
from latentkv.store.fingerprint import STORE_VERSION, model_fingerprint
from latentkv.store.store import LatentStore
from latentkv.store.writer import WriteBehind


def warn(message: str) -> None:
    print(f"latentkv: warning: {message}", file=sys.stderr, flush=True)


class StoreTier:
    def __init__(self, store: LatentStore, caches: list, pool: BlockPool, max_pending: int = 1024):
        self.store = store
        self.caches = caches
        self.pool = pool
        self.block_size = pool.block_size
        self.writer = WriteBehind(store, max_pending)
        self.on_disk: set[bytes] = set()   # hashes this process wrote or read (skip re-writing)

    @property
    def counters(self):
        return self.store.counters

    # -- RAM -> disk -------------------------------------------------------------------
    def save(self, blocks: list[tuple[int, bytes, tuple, bytes]]) -> None:
        """Queue (block id, parent hash, token ids, block hash) blocks for writing. Their
        latents are copied now (one gather per cache tensor), before the blocks can change."""
        blocks = [b for b in blocks if b[3] not in self.on_disk]
        if not blocks:
            return
        self.on_disk.update(b[3] for b in blocks)
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
        wanted = [(block_hashes[i], block_hashes[i - 1] if i else NO_HASH, tuple(token_ids[i * bs:(i + 1) * bs]))
                  for i in range(len(hits), min(len(block_hashes), len(hits) + max(room, 0)))]
        found: list[StoredBlock] = []
        for block in self.store.read_chain(wanted):
            if block is None or not self.fits(block):
                break
            found.append(block)
        if not found:
            return []
        self.pool.take(hits)   # so allocating cannot evict the RAM hits themselves
        ids = self.pool.allocate(len(found))
        self.place(ids, found)
        for block_id, block in zip(ids, found):
            self.pool.register(block_id, block.parent_hash, block.token_ids, block.block_hash)
            self.on_disk.add(block.block_hash)
        self.pool.free(list(reversed(ids)) + list(reversed(hits)))
        return ids

    def fits(self, block: StoredBlock) -> bool:
        """Shapes and dtypes match this engine's caches (the fingerprint makes this so;
        checked anyway so a bad file can never raise inside the scheduler)."""
        if len(block.tensors) != len(self.caches):
            return False
        for stored, cache in zip(block.tensors, self.caches):
            targets = cache.tensors()
            if len(stored) != len(targets) or any(
                    s.shape != t.shape[1:] or s.dtype != t.dtype for s, t in zip(stored, targets)):
                return False
        return True

    def place(self, block_ids: list[int], blocks: list[StoredBlock]) -> None:
        """Copy the blocks' latents into the caches: one index_copy_ per cache tensor."""
        index = torch.tensor(block_ids, device=self.caches[0].tensors()[0].device)
        for layer, cache in enumerate(self.caches):
            for j, dst in enumerate(cache.tensors()):
                src = torch.stack([b.tensors[layer][j] for b in blocks])
                dst.index_copy_(0, index, src.to(dst.device, non_blocking=True))

    def close(self) -> None:
        self.writer.close()
        self.store.close()

    def describe(self) -> str:
        return (f"KV store {self.store.root} ({self.store.size / 2**20:.1f} MiB of "
                f"{self.store.max_size / 2**20:.0f} MiB): {self.store.num_blocks()} blocks usable by this model "
                f"(fingerprint {self.store.fingerprint[:12]})")


def open_tier(args, model_dtype: torch.dtype, caches: list, pool: BlockPool) -> StoreTier | None:
    """The engine's store tier for `args.kv_store`, or None (off, or unusable: one warning)."""
    if not args.kv_store:
        return None
    if not pool.enable_prefix_caching:
        warn(f"the KV store {args.kv_store} needs prefix caching, which is off; running without the store")
        return None
    dtype = dtype_name(model_dtype)
    fingerprint = model_fingerprint(args.model, dtype, args.kv_cache_dtype, args.block_size, args.quantization)
    describe = {"model": str(args.model), "dtype": dtype, "kv_cache_dtype": args.kv_cache_dtype,
                "block_size": args.block_size, "quantization": args.quantization, "store_version": STORE_VERSION}
    try:
        store = LatentStore(args.kv_store, fingerprint, args.kv_store_max_size, describe)
    except OSError as err:
        warn(f"the KV store {args.kv_store} is not usable ({err}); running without it")
        return None
    return StoreTier(store, caches, pool)
