"""`latentkv bench soak` against started `latentkv serve` processes on the tiny model: a few seconds of it
in the suite (the command, its table, JSON and plot), its one-minute form on two processes sharing one
KV store as a slow test: no 5xx, no error of any kind, no leaked block, both processes exit 0."""

from __future__ import annotations

import json

import pytest

from latentkv.bench.soak import KINDS
from latentkv.cli import main

TINY = ["--max-model-len", "256", "--kv-cache-memory", "1MiB", "--prefix-words", "40", "--concurrency", "8"]


def soak(tiny_lm, tmp_path, *extra) -> dict:
    out = tmp_path / "soak"
    code = main(["bench", "soak", "--model", str(tiny_lm()[0]), *TINY, "--out", str(out), *extra])
    result = json.loads((out / "soak.json").read_text())
    assert (out / "soak.png").stat().st_size > 0
    assert code == 0, {k: result[k] for k in ("errors_by_kind", "client_5xx", "server_5xx", "leaked_blocks")}
    return result


def test_a_short_soak_reports_and_passes(tiny_lm, tmp_path):
    result = soak(tiny_lm, tmp_path, "--minutes", "0.1", "--sample-every", "2")
    assert result["requests"] > 0 and result["samples"] and result["exit_codes"] == [0]
    assert result["leaked_blocks"] == [0] and result["samples"][-1]["rss_mib.0"] > 0


@pytest.mark.slow
def test_one_minute_on_two_servers_sharing_a_store(tiny_lm, tmp_path):
    result = soak(tiny_lm, tmp_path, "--minutes", "1", "--servers", "2", "--sample-every", "5")
    assert result["client_5xx"] == result["server_5xx"] == 0 and not result["errors_by_kind"]
    assert result["leaked_blocks"] == [0, 0] and result["exit_codes"] == [0, 0]
    assert {kind for kind, _ in (key.split(" ", 1) for key in result["outcomes"])} == set(KINDS)
    assert all(store["hits"] > 0 and store["bytes_written"] > 0 for store in result["store"])
