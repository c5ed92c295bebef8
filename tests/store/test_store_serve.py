"""The store behind the HTTP server: a restarted server reuses the first one's blocks, and
/metrics shows the store counters."""

from __future__ import annotations

import re

import httpx
from server.server_helpers import MODEL_NAME, start_server

PROMPT = "the quick brown fox jumps over the lazy dog. " * 3 + "one two three"


def complete(server) -> dict:
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    r = httpx.post(server.base_url + "/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def test_restarted_server_reuses_the_store(lm_folder, tmp_path):
    kwargs = dict(kv_store=str(tmp_path / "store"), block_size=4, kv_cache_memory="2MiB")
    first = start_server(lm_folder(), **kwargs)
    try:
        before = complete(first)
        assert metric(first, "latentkv_store_hits_total") == 0
    finally:
        first.stop()
        first.engine.close()
    second = start_server(lm_folder(), **kwargs)
    try:
        after = complete(second)
        assert metric(second, "latentkv_store_hits_total") >= 8
        assert metric(second, "latentkv_store_bytes_read_total") > 0
        assert metric(second, "latentkv_store_corrupt_blocks_total") == 0
    finally:
        second.stop()
    assert after["choices"][0]["text"] == before["choices"][0]["text"]
