"""The store as the engine's second tier: restart reuse, fingerprints, collisions, corrupt
files, two engines on one directory, an unusable store. Tiny models, greedy outputs
compared with a cold run (no store)."""

from __future__ import annotations

import random

import pytest
import torch

import latentkv.cache.block_pool as block_pool
from latentkv import LLM, SamplingParams
from latentkv.cache.latent_cache import LatentCache
from latentkv.store.files import StoredBlock, Unplaceable, decode, encode, read_file
from latentkv.store.store import SUFFIX
from latentkv.store.tier import CacheSlots, Recent, StoreTier, block_rows

BS = 4
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def make_llm(folder, **kw):
    return LLM(str(folder), **{**dict(dtype="float32", block_size=BS, kv_cache_memory="2MiB", seed=0), **kw})


def ids(seed, n, vocab=300):
    rng = random.Random(seed)
    return [rng.randrange(2, vocab) for _ in range(n)]


PREFIX = ids(0, 8 * BS)  # 8 full blocks
FIRST = PREFIX + ids(1, 5)  # served before the restart
SECOND = PREFIX + ids(2, 7)  # after it: shares the 8 blocks


def run(llm, prompt):
    return llm.generate([{"prompt_token_ids": prompt}], GREEDY, use_tqdm=False)[0]


def serve_and_stop(folder, store, prompt=FIRST, **kw):
    llm = make_llm(folder, kv_store=str(store), **kw)
    run(llm, prompt)
    llm.engine.close()  # flushes the write-behind queue


def block_paths(store):
    return sorted(store.glob(f"*/blocks/*/*{SUFFIX}"))


@pytest.mark.parametrize("cache", [{}, {"kv_cache_dtype": "q4_0"}])  # q4_0: uint8 codes and float16 scales on disk
def test_restart_reuses_blocks_and_outputs_match_cold(lm_folder, tmp_path, cache):
    folder = lm_folder()
    cold = run(make_llm(folder, **cache), SECOND)
    serve_and_stop(folder, tmp_path / "store", **cache)
    assert len(block_paths(tmp_path / "store")) >= 8
    llm = make_llm(folder, kv_store=str(tmp_path / "store"), **cache)
    warm = run(llm, SECOND)
    stats = llm.engine.stats()
    assert stats["store_hits"] == 8 and stats["store_corrupt_blocks"] == 0
    assert warm.num_cached_tokens == 8 * BS
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    assert stats["store_bytes_read"] > 0


def test_another_model_or_cache_dtype_misses(lm_folder, tmp_path):
    store = tmp_path / "store"
    serve_and_stop(lm_folder(), store)
    for other in (
        make_llm(lm_folder("v2_dense"), kv_store=str(store)),
        make_llm(lm_folder(), kv_store=str(store), kv_cache_dtype="int8"),
    ):
        out = run(other, SECOND)
        assert other.engine.stats()["store_hits"] == 0 and out.num_cached_tokens == 0
    assert len([d for d in store.iterdir() if d.is_dir()]) == 3  # one subdirectory per fingerprint


def test_forced_hash_collision_is_a_miss(lm_folder, tmp_path, monkeypatch):
    """Every block hash depends only on the parent and the block's length, so two
    different prompts of one length collide on every block."""
    folder = lm_folder()
    other = ids(7, len(FIRST))
    cold = run(make_llm(folder), other)
    monkeypatch.setattr(
        block_pool, "hash_block", lambda parent, tokens: (parent + bytes([len(tokens)]) * 16)[:16].ljust(16, b"\0")
    )
    serve_and_stop(folder, tmp_path / "store")
    llm = make_llm(folder, kv_store=str(tmp_path / "store"))
    out = run(llm, other)
    stats = llm.engine.stats()
    assert stats["store_hits"] == 0 and stats["store_misses"] >= 1
    assert out.outputs[0].token_ids == cold.outputs[0].token_ids


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_first_block_is_skipped_counted_removed(lm_folder, tmp_path, damage):
    folder = lm_folder()
    cold = run(make_llm(folder), SECOND)
    store = tmp_path / "store"
    serve_and_stop(folder, store)
    first_hash = block_pool.hash_block(block_pool.NO_HASH, PREFIX[:BS]).hex()
    (path,) = [p for p in block_paths(store) if p.name.startswith(first_hash)]
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[-3] ^= 0x10  # inside the last tensor's bytes
    path.write_bytes(bytes(data))
    llm = make_llm(folder, kv_store=str(store))
    out = run(llm, SECOND)
    stats = llm.engine.stats()
    assert stats["store_corrupt_blocks"] == 1 and stats["store_hits"] == 0 and stats["store_misses"] == 1
    llm.engine.close()  # the recomputed block was written again, whole, in its place
    assert decode(path.read_bytes()).token_ids == tuple(PREFIX[:BS])
    assert out.outputs[0].token_ids == cold.outputs[0].token_ids


def test_a_chain_with_a_missing_block_serves_up_to_it(lm_folder, tmp_path):
    """Block 5 of 8 deleted: blocks 1-4 are read into the cache and served, the gap is one miss,
    and the blocks taken for nothing go back (the output is the cold run's)."""
    folder = lm_folder()
    cold = run(make_llm(folder), SECOND)
    store = tmp_path / "store"
    serve_and_stop(folder, store)
    parent = block_pool.NO_HASH
    for i in range(5):
        parent = block_pool.hash_block(parent, PREFIX[i * BS : (i + 1) * BS])
    (path,) = [p for p in block_paths(store) if p.name.startswith(parent.hex())]
    path.unlink()
    llm = make_llm(folder, kv_store=str(store))
    out = run(llm, SECOND)
    stats = llm.engine.stats()
    assert (stats["store_hits"], stats["store_misses"], stats["store_corrupt_blocks"]) == (4, 1, 0)
    assert out.outputs[0].token_ids == cold.outputs[0].token_ids


def test_two_engines_share_one_directory(lm_folder, tmp_path):
    folder = lm_folder()
    store = str(tmp_path / "store")
    a, b = make_llm(folder, kv_store=store), make_llm(folder, kv_store=store)
    other_prefix = ids(3, 6 * BS)
    run(a, FIRST)
    run(b, other_prefix + ids(4, 3))
    a.engine.store.writer.flush()
    b.engine.store.writer.flush()
    # each reads what the other wrote, while both are running
    out_b = run(b, SECOND)
    out_a = run(a, other_prefix + ids(5, 2))
    assert b.engine.stats()["store_hits"] == 8 and a.engine.stats()["store_hits"] == 6
    cold = make_llm(folder)
    assert out_b.outputs[0].token_ids == run(cold, SECOND).outputs[0].token_ids
    assert out_a.outputs[0].token_ids == run(cold, other_prefix + ids(5, 2)).outputs[0].token_ids


def test_unusable_store_warns_once_and_runs_without_it(lm_folder, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    llm = make_llm(lm_folder(), kv_store=str(blocker / "store"))
    assert llm.engine.store is None and "store_hits" not in llm.engine.stats()
    assert run(llm, FIRST).outputs[0].token_ids
    assert capsys.readouterr().err.count("not usable") == 1


def test_write_failure_warns_once_then_drops(lm_folder, tmp_path, capsys, monkeypatch):
    llm = make_llm(lm_folder(), kv_store=str(tmp_path / "store"))
    store = llm.engine.store.store

    def disk_full(block):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "write", disk_full)
    run(llm, FIRST)
    run(llm, SECOND + ids(9, 9))
    llm.engine.store.writer.flush()
    stats = llm.engine.stats()
    assert stats["store_write_drops"] >= 9 and stats["store_bytes_written"] == 0
    assert capsys.readouterr().err.count("cannot write to the KV store") == 1


def test_cache_slots_place_a_block_in_its_rows_and_refuse_another_shape(tmp_path):
    """The restore's place: a block file lands in one block's rows of every layer's cache
    tensors (the other blocks untouched); a file of another cache shape is refused whole."""
    caches = [LatentCache(4, BS, 16, 8, torch.bfloat16, "int8") for _ in range(3)]
    before = [[t.clone() for t in c.tensors()] for c in caches]
    rows = [
        [torch.randint(-127, 128, (BS, 16), dtype=torch.int8), torch.rand(BS), torch.randn(BS, 8).bfloat16()]
        for _ in range(3)
    ]
    path = tmp_path / "b.safetensors"
    path.write_bytes(encode(StoredBlock(b"h" * 16, b"p" * 16, tuple(range(BS)), rows)))
    slots = CacheSlots(block_rows(caches), 2)
    read_file(path, slots)
    assert slots.complete()
    for layer, cache in enumerate(caches):
        for j, t in enumerate(cache.tensors()):
            assert torch.equal(t[2], rows[layer][j])
            assert torch.equal(t[[0, 1, 3]], before[layer][j][[0, 1, 3]])
    other = [LatentCache(4, BS, 24, 8, torch.bfloat16, "int8") for _ in range(3)]
    with pytest.raises(Unplaceable):
        read_file(path, CacheSlots(block_rows(other), 2))
    assert not CacheSlots(block_rows(caches), 1).complete()


class FakeCache:
    def __init__(self):
        self.t = torch.arange(8.0).reshape(4, 2)

    def tensors(self):
        return [self.t]


class FakeStore:
    def __init__(self):
        self.files = set()

    def contains(self, block_hash):
        return block_hash in self.files


class FakeWriter:
    failed = False

    def __init__(self):
        self.submitted = []

    def submit(self, block):
        self.submitted.append(block.block_hash)


def test_a_block_evicted_after_it_was_written_is_written_again_when_computed_again():
    """The tier skips re-writing a block it wrote, but only while its file is there: one evicted by the size
    bound (or by another process on the directory) is written again the next time it is computed."""
    tier = StoreTier.__new__(StoreTier)
    tier.caches, tier.store, tier.writer, tier.recent = [FakeCache()], FakeStore(), FakeWriter(), Recent()
    block = (1, block_pool.NO_HASH, (5, 6), b"h1")
    tier.save([block])
    tier.store.files.add(b"h1")  # the writer wrote it
    tier.save([block])
    assert tier.writer.submitted == [b"h1"]
    tier.store.files.discard(b"h1")  # evicted
    tier.save([block])
    assert tier.writer.submitted == [b"h1", b"h1"]


def test_the_memory_of_written_blocks_is_bounded():
    recent = Recent(capacity=2)
    for h in (b"a", b"b", b"a", b"c"):
        recent.add(h)
    assert len(recent) == 2 and b"a" in recent and b"c" in recent and b"b" not in recent
