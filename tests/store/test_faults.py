"""The store under faults and at shutdown: a read-only directory still serves what it holds, a
full disk stops the writing (one warning) and serving goes on, a close writes the whole queue
or drops what its timeout leaves (counted), and `LLM` as a context manager flushes on exit.

The tests run as root, whom chmod does not stop, and mounting a read-only file system needs
privileges: `read_only` makes every write under a directory fail with EROFS instead, at the
calls the store writes through (open for writing, mkdir, rename, unlink, utime)."""

from __future__ import annotations

import builtins
import errno
import io
import os
import threading

import pytest

import latentkv.store.files as store_files
from latentkv.store.store import LatentStore
from latentkv.store.writer import WriteBehind
from store.test_store import make_block, open_store
from store.test_tier import FIRST, SECOND, block_paths, make_llm, run, serve_and_stop

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


@pytest.fixture
def read_only(monkeypatch):
    """-> make(root): from then on every write under `root` fails as on a read-only mount."""

    def make(root):
        root = os.path.realpath(root)

        def inside(path) -> bool:
            return not isinstance(path, int) and os.path.realpath(os.fspath(path)).startswith(root)

        def refuse(path):
            raise OSError(errno.EROFS, "Read-only file system", os.fspath(path))

        def guard(real, writes):
            def guarded(path, *args, **kwargs):
                if writes(args, kwargs) and inside(path):
                    refuse(path)
                return real(path, *args, **kwargs)

            return guarded

        opens_for_writing = guard(
            builtins.open, lambda a, k: any(c in (a[0] if a else k.get("mode", "r")) for c in "wax+")
        )
        monkeypatch.setattr(builtins, "open", opens_for_writing)
        monkeypatch.setattr(io, "open", opens_for_writing)  # pathlib's open
        monkeypatch.setattr(os, "open", guard(os.open, lambda a, k: bool((a[0] if a else k["flags"]) & WRITE_FLAGS)))
        for name in ("mkdir", "replace", "rename", "unlink", "utime", "rmdir"):
            monkeypatch.setattr(os, name, guard(getattr(os, name), lambda a, k: True))

    return make


def test_a_read_only_store_serves_what_it_holds(lm_folder, tmp_path, read_only, capsys):
    store = tmp_path / "store"
    serve_and_stop(lm_folder(), store)
    cold = run(make_llm(lm_folder()), SECOND)
    files = block_paths(store)
    read_only(store)
    llm = make_llm(lm_folder(), kv_store=str(store))
    assert llm.engine.store is not None and llm.engine.store.store.read_only
    out = run(llm, SECOND)
    llm.close()
    assert out.outputs[0].token_ids == cold.outputs[0].token_ids
    assert out.num_cached_tokens >= 8 * 4  # the 8 shared blocks came from the store
    assert block_paths(store) == files  # nothing written, nothing removed
    err = capsys.readouterr().err
    assert err.count("cannot be written") == 1 and "not usable" not in err


def test_a_read_only_store_counts_its_blocks_as_drops(lm_folder, tmp_path, read_only):
    store = tmp_path / "store"
    serve_and_stop(lm_folder(), store)
    read_only(store)
    llm = make_llm(lm_folder(), kv_store=str(store))
    run(llm, SECOND)
    stats = llm.engine.stats()
    assert stats["store_hits"] >= 8 and stats["store_write_drops"] > 0 and stats["store_bytes_written"] == 0


def test_a_full_disk_stops_writing_with_one_warning_and_serving_goes_on(lm_folder, tmp_path, capsys, monkeypatch):
    store = tmp_path / "store"
    llm = make_llm(lm_folder(), kv_store=str(store))
    cold = make_llm(lm_folder())

    def disk_full(path, *args, **kwargs):  # the block file's own write (files.write_atomic)
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(store_files, "open", disk_full, raising=False)
    outs = [run(llm, prompt) for prompt in (FIRST, SECOND, FIRST)]
    report = llm.close()
    assert [o.outputs[0].token_ids for o in outs] == [run(cold, p).outputs[0].token_ids for p in (FIRST, SECOND, FIRST)]
    assert report.written == 0 and block_paths(store) == []
    assert not list((store).glob("*/tmp/*.tmp"))  # no half-written temp file left
    assert capsys.readouterr().err.count("cannot write to the KV store") == 1


def test_close_writes_the_whole_queue(tmp_path, monkeypatch):
    """Blocks queued behind a slow write are all on disk when close returns."""
    store = open_store(tmp_path)
    started, release = threading.Event(), threading.Event()
    real_write = store.write

    def slow_write(block):
        started.set()
        release.wait()
        return real_write(block)

    monkeypatch.setattr(store, "write", slow_write)
    writer = WriteBehind(store)
    for i in range(5):
        writer.submit(make_block(i))
    assert started.wait(timeout=60)
    release.set()
    report = writer.close()
    assert report.written == 5 and report.dropped == 0 and store.num_blocks() == 5
    assert not writer.thread.is_alive()


def test_close_drops_what_its_timeout_leaves_and_counts_it(tmp_path, monkeypatch):
    """A stuck disk: close gives up after its timeout, counts the blocks it could not write as
    drops and returns (the block being written is left to its daemon thread)."""
    store = open_store(tmp_path)
    stuck = threading.Event()
    monkeypatch.setattr(store, "write", lambda block: stuck.wait())
    writer = WriteBehind(store)
    for i in range(4):
        writer.submit(make_block(i))
    try:
        report = writer.close(timeout=0.2)
    finally:
        stuck.set()
    assert report.written == 0 and report.dropped == 3 and store.counters.write_drops == 3


def test_llm_as_a_context_manager_writes_the_queue_on_exit(lm_folder, tmp_path):
    store = tmp_path / "store"
    with make_llm(lm_folder(), kv_store=str(store)) as llm:
        tier = llm.engine.store
        run(llm, FIRST)
    assert llm.engine.store is None and not tier.writer.thread.is_alive()
    assert len(block_paths(store)) >= 8 and tier.counters.write_drops == 0
    assert llm.close() is None  # a second close has nothing to do
    assert run(llm, FIRST).outputs[0].token_ids  # and the LLM still generates, without the store


def test_an_unwritable_directory_without_blocks_is_not_used(tmp_path, read_only):
    (tmp_path / "store").mkdir()
    read_only(tmp_path / "store")
    with pytest.raises(OSError):
        LatentStore(tmp_path / "store", "f" * 32, 2**20)
