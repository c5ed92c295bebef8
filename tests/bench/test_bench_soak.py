"""`latentkv bench soak` against started `latentkv serve` processes on the tiny model: a few seconds of it
in the suite (the command, its table, JSON and plot), its one-minute form on two processes sharing one
KV store as a slow test: no 5xx, no error of any kind, no leaked block, both processes exit 0."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import httpx
import pytest

from latentkv.bench import soak as soak_module
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


def test_a_metrics_page_not_served_in_time_is_an_error_of_the_run_not_its_end(monkeypatch):
    """A server too busy to answer /metrics within the scrape's timeout: the run goes on, the missed sample
    is counted as an error (so the soak fails, and says why)."""
    calls = []

    def flaky(servers, started, outcomes):
        calls.append(1)
        if len(calls) == 1:
            raise httpx.ReadTimeout("timed out")
        return {"t": 0.0, "requests": 0, "rss_mib.0": 1.0, "blocks.0": 0, "running.0": 0, "waiting.0": 0, "5xx.0": 0}

    async def ok(client, kind, rng, load):
        await asyncio.sleep(0.01)
        return "ok"

    monkeypatch.setattr(soak_module, "sample", flaky)
    monkeypatch.setattr(soak_module, "one", ok)
    server = SimpleNamespace(url="http://127.0.0.1:9")
    outcomes, samples = asyncio.run(soak_module.drive([server], 0.3, 2, 0, None, 0.1))
    assert outcomes[("metrics", "client error ReadTimeout")] == 1 and len(samples) == len(calls) - 1
    assert sum(c for (k, _), c in outcomes.items() if k != "metrics") > 0  # the clients went on
