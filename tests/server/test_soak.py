"""A small soak (tests/server/soak.py): mixed valid, streamed, abandoned, cancelled and
hostile requests at once on a cache small enough to preempt. No 5xx anywhere, every
block back afterwards, the server healthy."""

from __future__ import annotations

import pytest

from server_helpers import start_server
from soak import soak


@pytest.fixture(scope="module")
def small_cache_server(tiny_model_dir):
    running = start_server(
        tiny_model_dir, max_num_seqs=8, max_model_len=128, kv_cache_memory="96KiB", max_request_bytes=65536
    )
    yield running
    running.stop()


def test_mixed_hostile_load_leaves_nothing_behind(small_cache_server):
    figures = soak(small_cache_server, requests=32, concurrency=8, seed=1)
    statuses = figures["statuses"]
    assert not [s for s in statuses if s.startswith("5") or "error" in s], figures
    assert not [s for s in figures["http_statuses_counted"] if s.startswith("5")], figures
    assert statuses.get("200", 0) > 0 and statuses.get("400", 0) + statuses.get("413", 0) > 0, figures
    assert figures["blocks_used_after"] == 0 and figures["healthy_after"], figures
    assert "error" not in figures["finish_reasons"], figures
