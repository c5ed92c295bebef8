import pytest

from latentkv.cache.block_pool import BlockPool, hash_block, hash_full_blocks


def full_hashes(tokens, bs=4):
    return hash_full_blocks(tokens, bs)


def register_all(pool, ids, tokens, bs=4):
    hashes = full_hashes(tokens, bs)
    for i, h in enumerate(hashes):
        pool.register(ids[i], hashes[i - 1] if i else b"", tokens[i * bs : (i + 1) * bs], h)
    return hashes


def test_allocate_free_counts_and_exhaustion():
    pool = BlockPool(4, 4)
    ids = pool.allocate(3)
    assert len(set(ids)) == 3 and pool.num_used == 3 and pool.num_free == 1
    with pytest.raises(RuntimeError):
        pool.allocate(2)
    pool.free(ids)
    assert pool.num_free == 4
    with pytest.raises(RuntimeError):
        pool.free(ids[:1])  # double free is caught


def test_chained_hash_depends_on_parent():
    a = hash_block(b"", [1, 2, 3, 4])
    b = hash_block(b"x", [1, 2, 3, 4])
    assert a != b
    assert full_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9]) == [a, hash_block(a, [5, 6, 7, 8])]


def test_prefix_hit_after_free_and_lru_eviction():
    pool = BlockPool(4, 4)
    tokens = list(range(12))
    ids = pool.allocate(3)
    hashes = register_all(pool, ids, tokens)
    pool.free(list(reversed(ids)))
    assert pool.num_free == 4
    # freed blocks keep their hash: a new request with the same prefix hits all three
    hits = pool.match_prefix(hashes, tokens)
    assert hits == ids and pool.prefix_queries == 3 and pool.prefix_hits == 3
    assert pool.count_revived(hits) == 3
    pool.take(hits)
    assert pool.num_free == 1 and all(pool.blocks[b].ref_count == 1 for b in ids)
    pool.free(list(reversed(ids)))
    # allocating evicts least recently freed first: the never-used block, then the tail
    first = pool.allocate(2)
    assert first[0] not in ids and first[1] == ids[2]
    assert pool.match_prefix(hashes, tokens) == ids[:2]


def test_shared_block_refcount():
    pool = BlockPool(3, 2)
    ids = pool.allocate(1)
    h = register_all(pool, ids, [7, 8], bs=2)
    hits = pool.match_prefix(h, [7, 8])
    pool.take(hits)
    assert pool.blocks[ids[0]].ref_count == 2
    pool.free(ids)
    assert pool.num_free == 2  # still held by the second user
    pool.free(hits)
    assert pool.num_free == 3


def test_hit_verified_against_tokens():
    pool = BlockPool(2, 2)
    ids = pool.allocate(1)
    h = register_all(pool, ids, [1, 2], bs=2)
    # same hash presented with other tokens (a forged collision) must not hit
    assert pool.match_prefix(h, [1, 3]) == []
    assert pool.match_prefix(h, [1, 2]) == ids


def test_prefix_caching_off_never_hits():
    pool = BlockPool(2, 2, enable_prefix_caching=False)
    ids = pool.allocate(1)
    h = register_all(pool, ids, [1, 2], bs=2)
    pool.free(ids)
    assert pool.match_prefix(h, [1, 2]) == [] and pool.prefix_hits == 0
