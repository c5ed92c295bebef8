"""`bench serve` survives its peers: a peer that refuses to start and one that dies under load are
recorded (row + reason from the log) and the bench goes on to the next concurrency and system.
Also the parts of the memory-pressure scenario that need no real engine. No timing assertions."""
import argparse
import json
import socket
import sys
from pathlib import Path

import pytest

from latentkv.bench.pressure import config_shape, kv_bytes_per_token, original_shape
from latentkv.bench.serve import prepare, run_systems, show
from latentkv.bench.servers import Server, running_requests
from tiny_lm import save_tiny_lm

FAKE = str(Path(__file__).with_name("fake_peer.py"))
VOCAB = 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake(name: str, port: int, *mode: str) -> Server:
    return Server(name, [sys.executable, FAKE, str(port), *mode], settings="fake")


def load_args(port: int, **kw) -> argparse.Namespace:
    base = dict(concurrency=[1, 3], repeats=1, vocab=VOCAB, min_prompt=4, max_prompt=8, min_output=2, max_output=4,
                num_prompts=None, max_concurrency=None, port=port, threads=1, cache_memory="1MiB")
    return argparse.Namespace(**{**base, **kw})


def test_a_refusing_and_a_crashing_peer_are_recorded_and_the_bench_goes_on(tmp_path, capsys):
    port = free_port()
    args = load_args(port)
    systems = [fake("refuser", port, "refuse"), fake("crasher", port, "die", "1"), fake("steady", port, "ok")]
    results = run_systems(systems, args, tmp_path, {}, ready_timeout_s=60)
    by = {(r["system"], r["concurrency"]): r for r in results}
    assert sorted(by) == sorted((s.name, n) for s in systems for n in (1, 3))
    for n in (1, 3):
        refused = by[("refuser", n)]["error"]
        assert "exited with 3" in refused and "expect weight to be bfloat16" in refused  # the log's last lines
        crashed = by[("crasher", n)]["error"]  # the warm-up request passed, the first measured one killed it
        assert f"{n} concurrent" in crashed and "engine core died" in crashed
        steady = by[("steady", n)]
        assert "error" not in steady and steady["tok_s"] > 0 and steady["max_running"] is not None
    show(results, args)
    table = capsys.readouterr().out
    assert "failed: refuser: exited before it was ready" in table and "failed: crasher: 1 concurrent" in table


def test_at_most_max_concurrency_in_flight_and_every_prompt_sent(tmp_path):
    port = free_port()
    args = load_args(port, concurrency=[2], num_prompts=5, max_concurrency=2)
    [row] = run_systems([fake("steady", port, "ok")], args, tmp_path, {}, ready_timeout_s=60)
    assert row["prompts"] == 5 and 0 <= row["max_running"] <= 2
    assert row["tokens"] > 0 and row["ttft_mean"] >= 0


def test_original_kv_cache_per_token_from_its_config():
    smollm2_135m = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576}
    assert config_shape(smollm2_135m) == (30, 3, 64)
    assert kv_bytes_per_token((30, 3, 64), "bfloat16") == 2 * 30 * 3 * 64 * 2
    assert 8192 * kv_bytes_per_token((30, 3, 64), "bfloat16") == 180 * 2**20  # the 180 MiB
    assert config_shape({**smollm2_135m, "head_dim": 128}) == (30, 3, 128)
    assert config_shape({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64}) == (2, 4, 16)  # MHA
    assert kv_bytes_per_token((2, 4, 16), "float32") == 2 * 2 * 4 * 16 * 4


@pytest.mark.parametrize("page, running", [
    ('# HELP vllm:num_requests_running x\nvllm:num_requests_running{model_name="m",engine="0"} 7.0\n', 7.0),
    ("latentkv_num_requests_running 3.0\nlatentkv_num_requests_waiting 9.0\n", 3.0),
    ("latentkv_num_requests_waiting 9.0\n", None),
])
def test_running_requests_from_a_metrics_page(page, running):
    assert running_requests(page) == running


def test_pressure_scenario_sizes_the_cache_from_the_originals_config(tmp_path):
    save_tiny_lm(tmp_path / "lm")
    config = json.loads((tmp_path / "lm" / "config.json").read_text())
    args = argparse.Namespace(model=str(tmp_path / "lm"), source=str(tmp_path / "lm"), dtype="float32",
                              systems=["latentkv"], no_baselines=False, scenario="pressure", concurrency=[1, 4],
                              cache_memory="1GiB", min_prompt=8, max_prompt=64, min_output=4, max_output=12)
    prepare(args)
    assert int(args.cache_memory) == 8192 * kv_bytes_per_token(config_shape(config), "float32")
    assert (args.concurrency, args.max_concurrency, args.num_prompts, args.max_num_seqs) == ([32], 32, 64, 32)
    assert (args.min_prompt, args.max_prompt, args.min_output, args.max_output) == (1024, 1024, 128, 128)
    assert args.max_model_len >= 1024 + 128


def test_without_source_the_pressure_cache_comes_from_the_conversions_record(tmp_path):
    save_tiny_lm(tmp_path / "lm")
    (tmp_path / "lm" / "latentkv-source.json").write_text(json.dumps({"geometry": {"num_layers": 30, "num_kv_heads": 3,
                                                                                 "head_dim": 64}}))
    assert original_shape(tmp_path / "lm", None) == (30, 3, 64)
    (tmp_path / "lm" / "latentkv-source.json").unlink()
    with pytest.raises(SystemExit, match="pass --source"):
        original_shape(tmp_path / "lm", None)
