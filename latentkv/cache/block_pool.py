"""Block pool: ref-counted cache blocks, a free list, and prefix caching.

A block holds `block_size` consecutive tokens' latents of one sequence (in every
layer's `LatentCache` at the same block id). Blocks are shared between sequences
only through prefix caching, and only when *full*: a full block is identified by a
chained hash over its token ids and its parent block's hash, so equal hashes mean
equal whole prefixes. Hits are also verified against the token ids and parent hash
stored in the block, so a hash collision can never hand out wrong latents.

A block whose ref count drops to zero goes to the end of the free list but keeps its
hash: a later request with the same prefix can still hit it (it is taken back off the
free list). Allocation takes from the front of the free list, i.e. the least recently
freed block, and only then forgets its hash (lazy LRU eviction).
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

NO_HASH = b""


def hash_block(parent_hash: bytes, token_ids) -> bytes:
    """Chained hash of one full block: blake2b(parent hash ‖ token ids as int64)."""
    digest = hashlib.blake2b(parent_hash, digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def hash_full_blocks(token_ids: list[int], block_size: int, known: list[bytes] | None = None) -> list[bytes]:
    """Chained hashes of every full block of `token_ids`; extends `known` (already-hashed leading blocks)."""
    hashes = list(known or [])
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[-1] if hashes else NO_HASH
        hashes.append(hash_block(parent, token_ids[i * block_size : (i + 1) * block_size]))
    return hashes


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes = NO_HASH  # set once the block is full and registered
    parent_hash: bytes = NO_HASH
    token_ids: tuple = field(default_factory=tuple)

    def forget(self) -> None:
        self.hash, self.parent_hash, self.token_ids = NO_HASH, NO_HASH, ()


class BlockPool:
    """`num_blocks` blocks of `block_size` tokens; hands them out and takes them back.

    Counters: `num_used`, `num_free`, `prefix_queries` / `prefix_hits` (in full blocks
    looked up / found by `match_prefix`).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Ordered by time of freeing: front = least recently freed = evicted first.
        self.free_ids: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_id: dict[bytes, int] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0

    # -- counters ---------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    # -- prefix caching ---------------------------------------------------------
    def match_prefix(self, block_hashes: list[bytes], token_ids: list[int]) -> list[int]:
        """Block ids of the longest cached prefix among `block_hashes` (hashes of the full
        blocks of `token_ids`). Does not take references; call `take` on the result."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        parent = NO_HASH
        for i, block_hash in enumerate(block_hashes):
            self.prefix_queries += 1
            block_id = self.hash_to_id.get(block_hash)
            if block_id is None:
                break
            block = self.blocks[block_id]
            tokens = tuple(token_ids[i * self.block_size : (i + 1) * self.block_size])
            if block.hash != block_hash or block.parent_hash != parent or block.token_ids != tokens:
                break  # a collision or a stale entry: never share on a hash alone
            hits.append(block_id)
            parent = block_hash
        self.prefix_hits += len(hits)
        return hits

    def count_revived(self, block_ids: list[int]) -> int:
        """How many of `block_ids` (prefix hits) sit on the free list, i.e. would stop
        being allocatable once taken."""
        return sum(1 for b in block_ids if b in self.free_ids)

    def take(self, block_ids: list[int]) -> None:
        """Add a reference to each (cached) block, taking it off the free list if idle."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free_ids[block_id]
            block.ref_count += 1

    def register(self, block_id: int, parent_hash: bytes, token_ids, block_hash: bytes) -> None:
        """Mark a full, computed block as holding `token_ids` after prefix `parent_hash`."""
        if not self.enable_prefix_caching:
            return
        block = self.blocks[block_id]
        if block.hash == block_hash:
            return
        block.hash, block.parent_hash, block.token_ids = block_hash, parent_hash, tuple(token_ids)
        # First writer wins: another block may already hold this prefix (two requests
        # computed it at the same time); this one then just stays private.
        self.hash_to_id.setdefault(block_hash, block_id)

    # -- allocation -------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """`n` fresh blocks with ref count 1; raises if fewer than `n` are free."""
        if n > self.num_free:
            raise RuntimeError(f"block pool exhausted: need {n}, have {self.num_free} free")
        ids = []
        for _ in range(n):
            block_id, _ = self.free_ids.popitem(last=False)
            self.evict(block_id)
            self.blocks[block_id].ref_count = 1
            ids.append(block_id)
        return ids

    def evict(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.hash and self.hash_to_id.get(block.hash) == block_id:
            del self.hash_to_id[block.hash]
        block.forget()

    def free(self, block_ids: list[int]) -> None:
        """Drop one reference from each block. Pass a sequence's table in reverse so its
        tail blocks (least likely to be shared) are evicted first."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise RuntimeError(f"double free of block {block_id}")
            block.ref_count -= 1
            if block.ref_count == 0:
                if not block.hash:
                    block.forget()
                self.free_ids[block_id] = None
