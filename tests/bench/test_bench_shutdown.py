"""`latentkv bench shutdown` on the tiny model: SIGTERM at a long prompt's first token with clients in flight,
then a restart on the same KV store — the command's table, JSON and plot, and what it checks."""

from __future__ import annotations

import json

from latentkv.bench.shutdown import acceptable, full_blocks
from latentkv.cli import main


def test_a_sigterm_round_keeps_the_prompt_and_every_request_ends_well(tiny_lm, tmp_path):
    out = tmp_path / "shutdown"
    args = ["bench", "shutdown", "--model", str(tiny_lm()[0]), "--rounds", "2", "--prompt-tokens", "100"]
    args += ["--max-model-len", "1024", "--kv-cache-memory", "1MiB", "--in-flight", "3", "--busy", "1"]
    code = main([*args, "--out", str(out)])
    result = json.loads((out / "shutdown.json").read_text())
    assert (out / "shutdown.png").stat().st_size > 0
    assert code == 0, result
    assert len(result["rounds"]) == 2 and result["last_exit_code"] == 0
    for x in result["rounds"]:
        assert x["exit_code"] == 0 and not x["bad"]
        assert x["cold"]["text"] == x["restored"]["text"] and x["cold"]["ttft"] > 0 and x["restored"]["ttft"] > 0
        assert x["full_blocks"] > 0 and x["blocks_read_back"] == x["full_blocks"]
        written, dropped = x["store_written_dropped"]
        assert written >= 0 and dropped == 0
        assert any(key.startswith("before the signal") for key in x["in_flight"])


def test_what_counts_as_ending_well():
    assert acceptable(False, "completed") and acceptable(False, "error server_shutting_down")
    assert acceptable(True, "503 refused") and acceptable(True, "port closed")
    assert acceptable(False, "503 refused")  # sent just before the signal, not yet taken in: refused, well-formed
    assert not acceptable(False, "port closed") and not acceptable(False, "500 well-formed")
    assert not acceptable(True, "stream ended without [DONE]") and not acceptable(True, "500 well-formed")
    assert acceptable(True, "no answer (ReadError)") and not acceptable(False, "no answer (ReadError)")
    assert not acceptable(True, "stream cut (RemoteProtocolError)") and not acceptable(False, "error None")


def test_the_last_token_of_a_prompt_is_always_computed():
    assert full_blocks(16) == 0 and full_blocks(17) == 1 and full_blocks(33) == 2 and full_blocks(None) == 0
