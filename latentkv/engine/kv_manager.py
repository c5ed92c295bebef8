"""Sequence-level block bookkeeping on top of `BlockPool`: prefix lookup, growing a
sequence's block table for the tokens it computes this step, registering its full
blocks for reuse, and giving its blocks back."""

from __future__ import annotations

from latentkv.cache.block_pool import NO_HASH, BlockPool, hash_full_blocks
from latentkv.engine.sequence import Sequence


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVManager:
    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.block_size = pool.block_size
        self.store = None  # a latentkv.store.tier.StoreTier: the on-disk second tier, when set
        # batch-invariant mode: decode computes a token's latents with another kernel than a prompt's
        # prefill would (attention/prefill.py), so only blocks wholly inside the prompt are shared
        self.prompt_blocks_only = False

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of `seq`'s longest cached prefix of full blocks. At least one token is
        always left to compute (its logits pick the next token), and a request still
        collecting prompt logprobs gets no hits (cached tokens would have no logits)."""
        if not self.pool.enable_prefix_caching or seq.wants_prompt_logprobs:
            return []
        num_full = (len(seq) - 1) // self.block_size
        seq.block_hashes = hash_full_blocks(
            seq.token_ids[: num_full * self.block_size], self.block_size, seq.block_hashes[:num_full]
        )
        hits = self.pool.match_prefix(seq.block_hashes[:num_full], seq.token_ids)
        if self.store is not None and len(hits) < num_full:
            hits += self.store.restore(seq.block_hashes[:num_full], seq.token_ids, hits)
        return hits

    def blocks_needed(self, seq: Sequence, num_new_tokens: int, num_have: int | None = None) -> int:
        num_have = len(seq.block_table) if num_have is None else num_have
        return max(cdiv(seq.num_computed_tokens + num_new_tokens, self.block_size) - num_have, 0)

    def can_admit(self, seq: Sequence, hits: list[int], num_new_tokens: int) -> bool:
        """Would a waiting `seq` with prefix hits `hits` fit `num_new_tokens` more tokens?"""
        need = cdiv(len(hits) * self.block_size + num_new_tokens, self.block_size) - len(hits)
        return need <= self.pool.num_free - self.pool.count_revived(hits)

    def admit(self, seq: Sequence, hits: list[int]) -> None:
        """Start `seq` from its cached prefix: reference the hit blocks, skip their tokens."""
        self.pool.take(hits)
        seq.block_table = list(hits)
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_registered_blocks = len(hits)

    def can_grow(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.pool.num_free

    def grow(self, seq: Sequence, num_new_tokens: int) -> None:
        """Give `seq` enough blocks to hold its computed tokens plus `num_new_tokens`."""
        seq.block_table += self.pool.allocate(self.blocks_needed(seq, num_new_tokens))

    def register_full_blocks(self, seq: Sequence) -> None:
        """Offer each newly full *and computed* block to the prefix cache (with `prompt_blocks_only`,
        only blocks of prompt tokens). A partial last block is never registered, so it is never shared."""
        num_full = seq.num_computed_tokens // self.block_size
        if self.prompt_blocks_only:
            num_full = min(num_full, seq.num_prompt_tokens // self.block_size)
        if num_full <= seq.num_registered_blocks or not self.pool.enable_prefix_caching:
            return
        bs = self.block_size
        seq.block_hashes = hash_full_blocks(seq.token_ids[: num_full * bs], bs, seq.block_hashes[:num_full])
        full = []
        for i in range(seq.num_registered_blocks, num_full):
            parent = seq.block_hashes[i - 1] if i else NO_HASH
            full.append((seq.block_table[i], parent, tuple(seq.token_ids[i * bs : (i + 1) * bs]), seq.block_hashes[i]))
            self.pool.register(*full[-1])
        if self.store is not None:
            self.store.save(full)  # to the on-disk tier, written behind
        seq.num_registered_blocks = num_full

    def release(self, seq: Sequence) -> None:
        """Give back all of `seq`'s blocks, tail first (tails are evicted first)."""
        self.pool.free(list(reversed(seq.block_table)))
        seq.block_table = []
