"""`latentkv serve` on a KV store killed with SIGKILL at random points while it writes blocks, started
again on the same directory, many times: every block file there is whole and verifies, the restart
comes up without an error, answers the reference prompts with the text the first (cold) server gave,
and the directory stays under its size bound (the killed writers' temp files are removed on open).

Each block write is held 5 ms before its rename, and every other kill waits for a block's temp file
to appear, so that many kills land inside a write. A few kills in the suite;
`pytest -m slow tests/store/test_serve_crashes.py` runs 50."""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from latentkv.bench.servers import Running, Server, free_port, scrape, serve_command
from latentkv.store.files import decode, pid_alive
from latentkv.store.store import SUFFIX

BS = 4
REFERENCE = [list(range(10, 10 + 12 * BS)), list(range(200, 200 + 9 * BS)) + [7, 8, 9]]
BOUND_BLOCKS = 120  # the store's bound, in block files: the load evicts across the kills


# `latentkv serve` whose block writes wait 5 ms between their bytes and their rename: a write's window
# widened, so that a kill lands inside it often (the tiny model's blocks are written in microseconds)
SLOW_RENAME = """
import os, sys, time
replace = os.replace
os.replace = lambda src, dst: time.sleep(0.005) or replace(src, dst)
from latentkv.cli import main
sys.exit(main(sys.argv[1:]))
"""


def start(model_dir: Path, store: Path, max_size: int, log: Path, *more: str, slow_rename: bool = False) -> Running:
    """`latentkv serve` of the tiny model on `store`, up and ready (`more` flags win: the last counts)."""
    port = free_port()
    flags = ["--served-model-name", "tiny", "--dtype", "float32", "--kv-cache-memory", "4MiB"]
    flags += ["--max-model-len", "256", "--block-size", str(BS), "--kv-store", str(store)]
    flags += ["--kv-store-max-size", str(max_size), *more]
    cmd = serve_command(str(model_dir), port, flags)
    if slow_rename:
        cmd = [sys.executable, "-c", SLOW_RENAME, *cmd[cmd.index("serve") :]]
    # all cores may run it (threads=2); the engine itself on the one thread the suite gives it (conftest)
    return Running(Server("latentkv serve", cmd), port, log, threads=2)


def complete(url: str, prompt: list[int], max_tokens: int = 6) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def write_load(url: str, seed: int, stop: threading.Event) -> None:
    """New prompts one after another (each writes new blocks) until the server dies."""
    rng = random.Random(seed)
    while not stop.is_set():
        prompt = [rng.randrange(2, 320) for _ in range(rng.randint(5, 15) * BS)]
        try:
            httpx.post(
                url + "/v1/completions",
                json={"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0},
                timeout=60,
            )
        except httpx.HTTPError:
            return  # killed


def check_store(store: Path, max_size: int) -> tuple[int, int]:
    """Every block file whole and named by its hash, the directory under its bound; -> (files, temps)."""
    files = list(store.glob(f"*/blocks/*/*{SUFFIX}"))
    for path in files:
        block = decode(path.read_bytes())  # raises CorruptBlock for a torn or damaged file
        assert path.name == block.block_hash.hex() + SUFFIX
    assert sum(p.stat().st_size for p in files) <= max_size
    return len(files), len(list(store.glob("*/tmp/*.tmp")))


def crash_and_restart(model_dir: Path, tmp_path: Path, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    store = tmp_path / "store"
    server = start(model_dir, store, 2**30, tmp_path / "server0.log")
    try:
        reference = [complete(server.url, p) for p in REFERENCE]  # cold: the store is empty
        one_block = next(store.glob(f"*/blocks/*/*{SUFFIX}")).stat().st_size
        max_size = BOUND_BLOCKS * one_block
    finally:
        server.stop()
    assert server.proc.returncode == 0
    hits = left_temps = 0
    for kill in range(kills + 1):
        log = tmp_path / f"server{kill + 1}.log"
        server = start(model_dir, store, max_size, log, slow_rename=True)
        try:
            # the killed writers' temp files are gone: removed when the store opened
            assert not [t for t in store.glob("*/tmp/*.tmp") if not pid_alive(int(t.name.split("-")[0]))]
            assert [complete(server.url, p) for p in REFERENCE] == reference
            metrics = scrape(server.url)
            assert metrics["latentkv_store_corrupt_blocks_total"] == 0
            hits += metrics["latentkv_store_hits_total"]
            if kill == kills:
                break
            stop = threading.Event()
            clients = [threading.Thread(target=write_load, args=(server.url, rng.random(), stop)) for _ in range(3)]
            for c in clients:
                c.start()
            stop.wait(rng.uniform(0.2, 2.0))  # a random point of the writing
            if kill % 2:  # or the moment a block's temp file is seen: most likely inside its write
                seen_by = time.monotonic() + 5
                while not any(store.glob("*/tmp/*.safetensors.tmp")) and time.monotonic() < seen_by:
                    pass
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
            stop.set()
            for c in clients:
                c.join()
        finally:
            server.stop()
        text = log.read_text()
        assert "Traceback" not in text and "latentkv: warning" not in text, text
        left_temps += check_store(store, max_size)[1]
    assert server.proc.returncode == 0  # the last one, stopped by SIGTERM
    files, temps = check_store(store, max_size)
    assert hits > 0 and files > 0 and temps == 0
    print(f"{kills} kills: {left_temps} left a temp file (killed mid-write); {hits:.0f} store hits; {files} blocks")
    assert left_temps > 0 or kills < 10  # some kills landed inside a write


def test_kill_9_while_writing_then_restart(lm_folder, tmp_path):
    # two kills: one at a random point of the writing, one the moment a block's temp file is seen
    crash_and_restart(lm_folder(), tmp_path, kills=2, seed=0)


@pytest.mark.slow
def test_kill_9_fifty_times(lm_folder, tmp_path):
    crash_and_restart(lm_folder(), tmp_path, kills=50, seed=1)
