"""Two `latentkv serve` processes on one KV store directory at once (different ports, the same model),
with a RAM cache and a store bound small enough that blocks go back and forth between RAM and disk and
each process evicts the other's files under load: both read and write, a block one wrote is served by
the other after the other's restart, and no read is broken by the other's eviction: every greedy
answer is the text its prompt got first, whichever process answered it, with no 5xx and no corrupt
block."""

from __future__ import annotations

import random
import threading

import httpx

from latentkv.bench.servers import scrape
from latentkv.store.store import SUFFIX
from store.test_serve_crashes import BS, complete, start

SMALL = ("--kv-cache-memory", "48KiB", "--max-model-len", "64")  # ~40 blocks in RAM: restores from disk
BOUND_BLOCKS = 60  # the store's bound, in block files: the load below writes well over that


def prompts(seed: int) -> list[list[int]]:
    """5 shared prefixes of 6 blocks, each with 6 different tails."""
    rng = random.Random(seed)
    out = []
    for _ in range(5):
        prefix = [rng.randrange(2, 320) for _ in range(6 * BS)]
        out += [prefix + [rng.randrange(2, 320) for _ in range(rng.randint(1, 3) * BS + 1)] for _ in range(6)]
    return out


def store_counter(url: str, name: str) -> float:
    return scrape(url)[f"latentkv_store_{name}_total"]


def test_two_servers_share_one_store(lm_folder, tmp_path):
    model_dir = lm_folder()
    store = tmp_path / "store"
    first, second = prompts(0)[0], prompts(1)[0]
    a = start(model_dir, store, 2**30, tmp_path / "a0.log", *SMALL)
    try:
        cold = complete(a.url, first)
    finally:
        a.stop()  # its shutdown writes the store's queue: the blocks are on disk once it has exited
    one_block = next(store.glob(f"*/blocks/*/*{SUFFIX}")).stat().st_size
    bound = BOUND_BLOCKS * one_block
    a = start(model_dir, store, bound, tmp_path / "a.log", *SMALL)
    b = start(model_dir, store, bound, tmp_path / "b0.log", *SMALL)
    try:
        assert complete(b.url, first) == cold and store_counter(b.url, "hits") >= len(first) // BS - 1
        from_a = complete(a.url, second)  # written by a while b runs; b restarts, then serves them
        b.stop()
        assert b.proc.returncode == 0
        b = start(model_dir, store, bound, tmp_path / "b.log", *SMALL)
        assert complete(b.url, second) == from_a and store_counter(b.url, "hits") >= len(second) // BS - 1

        pool, answers, statuses = prompts(2), {}, []
        lock = threading.Lock()

        def client(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(30):
                i = rng.randrange(len(pool))
                server = rng.choice((a, b))
                body = {"model": "tiny", "prompt": pool[i], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
                r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
                with lock:
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        answers.setdefault(i, set()).add(r.json()["choices"][0]["text"])

        clients = [threading.Thread(target=client, args=(seed,)) for seed in range(4)]
        for c in clients:
            c.start()
        for c in clients:
            c.join()
        assert set(statuses) == {200}
        assert all(len(texts) == 1 for texts in answers.values()), answers  # one greedy text per prompt
        metrics = [scrape(a.url), scrape(b.url)]
    finally:
        a.stop()
        b.stop()
    assert a.proc.returncode == 0 and b.proc.returncode == 0
    for m in metrics:
        assert m["latentkv_store_corrupt_blocks_total"] == 0
        assert m["latentkv_store_hits_total"] > 0 and m["latentkv_store_bytes_written_total"] > 0  # both read, write
        assert not [k for k in m if k.startswith('latentkv_requests_total{status="5')]
    assert sum(m["latentkv_store_evicted_blocks_total"] for m in metrics) > 0  # the bound was hit under load
    assert sum(p.stat().st_size for p in store.glob(f"*/blocks/*/*{SUFFIX}")) <= bound
