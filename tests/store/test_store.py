"""LatentStore and block files without an engine: round trip, verification, LRU bound,
a writer killed with SIGKILL mid-write, the fingerprint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from latentkv.cache.block_pool import NO_HASH, hash_block
from latentkv.store.files import StoredBlock, Unplaceable, decode, encode, raw, read_file
from latentkv.store.fingerprint import model_fingerprint
from latentkv.store.store import SUFFIX, LatentStore
from latentkv.store.writer import WriteBehind

BS = 4


def make_block(i: int, parent: bytes = NO_HASH, ranks=(16, 16, 16), quantized: bool = True) -> StoredBlock:
    """A block of a 3-layer model: int8 latent + scale + bf16 rope, or one bf16 tensor."""
    tokens = tuple(range(i * BS, (i + 1) * BS))
    g = torch.Generator().manual_seed(i)
    if quantized:
        tensors = [
            [
                torch.randint(-127, 128, (BS, r), dtype=torch.int8, generator=g),
                torch.rand(BS, generator=g),
                torch.randn(BS, 8, generator=g).bfloat16(),
            ]
            for r in ranks
        ]
    else:
        tensors = [[torch.randn(BS, r + 8, generator=g).bfloat16()] for r in ranks]
    return StoredBlock(hash_block(parent, tokens), parent, tokens, tensors)


def open_store(root, max_size=2**30, fingerprint="f" * 32) -> LatentStore:
    return LatentStore(root, fingerprint, max_size, {"model": "test"})


@pytest.mark.parametrize("ranks", [(16, 16, 16), (16, 24, 8)])  # per-layer ranks: stored per layer
@pytest.mark.parametrize("quantized", [True, False])
def test_round_trip_keeps_every_tensor_bit_exact(ranks, quantized):
    block = make_block(3, parent=b"p" * 16, ranks=ranks, quantized=quantized)
    back = decode(encode(block))
    assert (back.block_hash, back.parent_hash, back.token_ids) == (block.block_hash, block.parent_hash, block.token_ids)
    for got, want in zip(back.tensors, block.tensors):
        assert [t.dtype for t in got] == [t.dtype for t in want]
        assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("ranks", [(16, 16, 16), (16, 24, 8)])
def test_read_file_places_every_tensor_where_asked_bit_exact(tmp_path, ranks):
    """A restore reads a file straight into the cache rows `place` names (one preadv per tensor,
    `all.j` split into its layers): the same bits as decode; a place that refuses a tensor is
    Unplaceable, not corrupt."""
    block = make_block(5, parent=b"q" * 16, ranks=ranks)
    path = tmp_path / "block.safetensors"
    path.write_bytes(encode(block))
    targets = [[torch.full_like(t, 7) for t in layer] for layer in block.tensors]
    asked = []

    def place(name, dtype, shape):
        asked.append(name)
        where, j = name.split(".")
        layers = range(len(targets)) if where == "all" else [int(where)]
        return [raw(targets[layer][int(j)]) for layer in layers]

    got, size = read_file(path, place)
    assert size == path.stat().st_size and got.tensors == []
    assert (got.block_hash, got.parent_hash, got.token_ids) == (block.block_hash, block.parent_hash, block.token_ids)
    assert all(torch.equal(a, b) for ta, tb in zip(targets, block.tensors) for a, b in zip(ta, tb))
    assert "token_ids" not in asked  # the tokens are the reader's, never placed
    with pytest.raises(Unplaceable):
        read_file(path, lambda name, dtype, shape: None)


def chain(n: int) -> list[StoredBlock]:
    blocks, parent = [], NO_HASH
    for i in range(n):
        blocks.append(make_block(i, parent))
        parent = blocks[-1].block_hash
    return blocks


def test_read_chain_serves_in_order_up_to_the_first_gap(tmp_path):
    store = open_store(tmp_path)
    blocks = chain(9)
    for i, block in enumerate(blocks):
        if i != 6:  # a gap: block 6 was never written
            store.write(block)
    wanted = [(b.block_hash, b.parent_hash, b.token_ids) for b in blocks]
    got = store.read_chain(wanted)
    assert [g.block_hash if g else None for g in got] == [b.block_hash for b in blocks[:6]] + [None] * 3
    assert all(torch.equal(g.tensors[1][0], b.tensors[1][0]) for g, b in zip(got[:6], blocks))
    # blocks 7 and 8 are not read: the chain stops at its gap
    assert (store.counters.hits, store.counters.misses) == (6, 1)
    assert store.counters.bytes_read == sum(store.path(b.block_hash).stat().st_size for b in blocks[:6])
    # a corrupt file in the chain: counted, removed, the chain cut there
    store.path(blocks[2].block_hash).write_bytes(b"torn")
    got = store.read_chain(wanted[:5])
    assert [g is not None for g in got] == [True, True, False, False, False]
    assert store.counters.corrupt_blocks == 1 and not store.path(blocks[2].block_hash).exists()


def test_read_verifies_tokens_and_parent(tmp_path):
    store = open_store(tmp_path)
    block = make_block(0)
    store.write(block)
    assert store.read(block.block_hash, NO_HASH, block.token_ids) is not None
    # the same hash asked for with other tokens or another parent: a collision, a miss
    assert store.read(block.block_hash, NO_HASH, (9, 9, 9, 9)) is None
    assert store.read(block.block_hash, b"x" * 16, block.token_ids) is None
    assert (store.counters.hits, store.counters.misses) == (1, 2)
    assert store.contains(block.block_hash)  # a collision does not delete the good block


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "renamed"])
def test_damaged_file_is_skipped_counted_and_removed(tmp_path, damage):
    store = open_store(tmp_path)
    block, other = make_block(0), make_block(1)
    store.write(block)
    path = store.path(block.block_hash)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-5]
    elif damage == "flip":
        data[len(data) // 2] ^= 0x01
    elif damage == "empty":
        data = b""
    else:  # another block's (valid) file under this block's name
        data = encode(other)
    path.write_bytes(bytes(data))
    assert store.read(block.block_hash, NO_HASH, block.token_ids) is None
    assert store.counters.corrupt_blocks == 1 and not path.exists()


def test_lru_eviction_keeps_the_size_bound(tmp_path):
    one = len(encode(make_block(0)))
    store = open_store(tmp_path, max_size=5 * one)
    blocks = [make_block(i) for i in range(20)]
    for i, block in enumerate(blocks):
        store.write(block)
        if i >= 1:  # keep block 0 recently used: it must survive
            time.sleep(0.01)  # distinct mtimes, so LRU order is defined
            assert store.read(blocks[0].block_hash, NO_HASH, blocks[0].token_ids) is not None
        on_disk = sum(p.stat().st_size for p in tmp_path.glob(f"*/blocks/*/*{SUFFIX}"))
        assert on_disk <= 5 * one and store.size == on_disk
    assert store.contains(blocks[0].block_hash) and store.contains(blocks[-1].block_hash)
    assert not store.contains(blocks[1].block_hash)
    assert store.counters.evicted_blocks >= 15


def test_two_processes_evict_under_one_bound(tmp_path):
    """Two stores (as two processes would) on one directory, different models: the bound
    is for the whole directory."""
    one = len(encode(make_block(0)))
    a = open_store(tmp_path, 6 * one, "a" * 32)
    b = open_store(tmp_path, 6 * one, "b" * 32)
    for i in range(10):
        a.write(make_block(i))
        b.write(make_block(100 + i))
    total = sum(p.stat().st_size for p in tmp_path.glob(f"*/blocks/*/*{SUFFIX}"))
    assert total <= 6 * one


CHILD = """
import os, sys, time
import latentkv.store.files as files
from latentkv.store.store import LatentStore
sys.path.insert(0, {tests!r})
from store.test_store import make_block

store = LatentStore({root!r}, "f" * 32, 2**30, None)
if {mode!r} in ("before-rename", "after-rename"):
    real_replace = files.os.replace
    def hang(src, dst):
        if {mode!r} == "after-rename":
            real_replace(src, dst)
        open({marker!r}, "w").close()
        time.sleep(60)
    files.os.replace = hang
    store.write(make_block(0))
else:  # write blocks as fast as possible until killed
    i = 0
    while True:
        store.write(make_block(i))
        if i == 3:
            open({marker!r}, "w").close()
        i += 1
"""


@pytest.mark.parametrize("mode", ["before-rename", "after-rename", "busy"])
def test_writer_killed_mid_write_leaves_nothing_served(tmp_path, mode):
    """Killed before its rename, after it (before anything else) or anywhere while writing: only
    whole blocks are there, temp files go when the store opens again, and the size ledger counts
    at least the bytes on disk (a block is counted before its rename), so crashes cannot take the
    directory past its bound."""
    root, marker = tmp_path / "store", tmp_path / "ready"
    tests = str(Path(__file__).resolve().parents[1])
    code = CHILD.format(tests=tests, root=str(root), marker=str(marker), mode=mode)
    child = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": tests})
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            assert child.poll() is None, "the writer child died before it got going"
            assert time.monotonic() < deadline, "the writer child never got going"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    store = open_store(root)  # a new process's view: dead writers' temp files are removed
    assert list(store.tmp_dir.iterdir()) == []
    files = list(root.glob(f"*/blocks/*/*{SUFFIX}"))
    if mode == "before-rename":
        assert files == [] and store.read(make_block(0).block_hash, NO_HASH, make_block(0).token_ids) is None
    if mode == "after-rename":
        assert len(files) == 1
    assert store.size >= sum(p.stat().st_size for p in files)
    for path in files:  # every block that is there is whole and served correctly
        block = decode(path.read_bytes())
        assert store.read(block.block_hash, block.parent_hash, block.token_ids) is not None
    assert store.counters.corrupt_blocks == 0


def test_stale_temp_files_go_whoever_wrote_them(tmp_path):
    """A temp file of a live pid stays while it is fresh (a write in flight); once it is an hour old it
    is a leftover (a reused pid, another pid namespace's writer) and opening the store removes it."""
    store = open_store(tmp_path)
    fresh, stale = (store.tmp_dir / f"{os.getpid()}-1-{name}.safetensors.tmp" for name in ("a", "b"))
    for path in (fresh, stale):
        path.write_bytes(b"partial")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    open_store(tmp_path)
    assert fresh.exists() and not stale.exists()


def later(path: Path) -> None:
    """File times are coarse (a clock tick): make a quick rewrite's time differ, as any real
    rewrite's would."""
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def test_fingerprint_follows_weights_config_and_cache_settings(tmp_path):
    from safetensors.torch import save_file

    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 8}))
    save_file({"w": torch.zeros(4)}, str(folder / "model.safetensors"))
    base = model_fingerprint(folder, "float32", "auto", 16, None)
    assert model_fingerprint(folder, "float32", "auto", 16, None) == base
    others = {
        model_fingerprint(folder, "bfloat16", "auto", 16, None),
        model_fingerprint(folder, "float32", "int8", 16, None),
        model_fingerprint(folder, "float32", "auto", 32, None),
        model_fingerprint(folder, "float32", "auto", 16, "int8"),
    }
    save_file({"w": torch.ones(4)}, str(folder / "model.safetensors"))  # same size, new weights
    later(folder / "model.safetensors")
    others.add(model_fingerprint(folder, "float32", "auto", 16, None))
    (folder / "config.json").write_text(json.dumps({"hidden_size": 9}))
    later(folder / "config.json")
    others.add(model_fingerprint(folder, "float32", "auto", 16, None))
    assert base not in others and len(others) == 6


def test_full_queue_drops_instead_of_waiting(tmp_path, monkeypatch):
    """A stuck disk: the writer thread blocks in its first write; further blocks fill the
    one-slot queue and then are dropped and counted, submit never waits."""
    store = open_store(tmp_path)
    release = threading.Event()
    real_write = store.write
    monkeypatch.setattr(store, "write", lambda block: release.wait() and real_write(block))
    writer = WriteBehind(store, max_pending=1)
    try:
        accepted = [writer.submit(make_block(i)) for i in range(6)]
        assert accepted.count(False) >= 4 and store.counters.write_drops == accepted.count(False)
    finally:
        release.set()
        writer.close()
    assert store.num_blocks() == accepted.count(True)


def test_nan_latents_are_never_written(tmp_path):
    store = open_store(tmp_path)
    bad = make_block(0, quantized=False)
    bad.tensors[1][0][0, 0] = float("nan")
    writer = WriteBehind(store)
    writer.submit(bad)
    writer.submit(make_block(1, quantized=False))
    writer.close()
    assert not store.contains(bad.block_hash) and store.num_blocks() == 1
    assert store.counters.write_drops == 1
