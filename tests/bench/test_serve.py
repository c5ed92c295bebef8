"""`bench serve` survives its peers: a peer that refuses to start and one that dies under load are
recorded (row + reason from the log) and the bench goes on to the next concurrency and system.
Also the parts of the memory-pressure scenario that need no real engine. No timing assertions."""

import argparse
import json
import re
import socket
import sys
from collections import Counter
from pathlib import Path

import pytest

from latentkv.bench.pressure import config_shape, kv_bytes_per_token, original_shape
from latentkv.bench.serve import FOLDER_SYSTEMS, SAMPLING, baselines, prepare, run_systems, show
from latentkv.bench.servers import Server, running_requests
from tiny_lm import save_tiny_lm

FAKE = str(Path(__file__).with_name("fake_peer.py"))
VOCAB = 100


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fake(name: str, port: int, *mode: str, env: dict | None = None) -> Server:
    return Server(name, [sys.executable, FAKE, str(port), *mode], env or {}, settings="fake")


def load_args(port: int, **kw) -> argparse.Namespace:
    base = dict(
        concurrency=[1, 3],
        repeats=1,
        vocab=VOCAB,
        min_prompt=4,
        max_prompt=8,
        min_output=2,
        max_output=4,
        num_prompts=None,
        max_concurrency=None,
        port=port,
        threads=1,
        cache_memory="1MiB",
    )
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


@pytest.mark.parametrize(
    "page, running",
    [
        ('# HELP vllm:num_requests_running x\nvllm:num_requests_running{model_name="m",engine="0"} 7.0\n', 7.0),
        ("latentkv_num_requests_running 3.0\nlatentkv_num_requests_waiting 9.0\n", 3.0),
        ("latentkv_num_requests_waiting 9.0\n", None),
    ],
)
def test_running_requests_from_a_metrics_page(page, running):
    assert running_requests(page) == running


def test_pressure_scenario_sizes_the_cache_from_the_originals_config(tmp_path):
    save_tiny_lm(tmp_path / "lm")
    config = json.loads((tmp_path / "lm" / "config.json").read_text())
    args = argparse.Namespace(
        model=str(tmp_path / "lm"),
        source=str(tmp_path / "lm"),
        dtype="float32",
        systems=["latentkv"],
        no_baselines=False,
        scenario="pressure",
        concurrency=[1, 4],
        cache_memory="1GiB",
        min_prompt=8,
        max_prompt=64,
        min_output=4,
        max_output=12,
    )
    prepare(args)
    assert int(args.cache_memory) == 8192 * kv_bytes_per_token(config_shape(config), "float32")
    assert (args.concurrency, args.max_concurrency, args.num_prompts, args.max_num_seqs) == ([32], 32, 64, 32)
    assert (args.min_prompt, args.max_prompt, args.min_output, args.max_output) == (1024, 1024, 128, 128)
    assert args.max_model_len >= 1024 + 128


def test_without_source_the_pressure_cache_comes_from_the_conversions_record(tmp_path):
    save_tiny_lm(tmp_path / "lm")
    (tmp_path / "lm" / "latentkv-source.json").write_text(
        json.dumps({"geometry": {"num_layers": 30, "num_kv_heads": 3, "head_dim": 64}})
    )
    assert original_shape(tmp_path / "lm", None) == (30, 3, 64)
    (tmp_path / "lm" / "latentkv-source.json").unlink()
    with pytest.raises(SystemExit, match="pass --source"):
        original_shape(tmp_path / "lm", None)


def test_each_sampling_pass_sends_its_settings_and_is_a_row_of_its_own(tmp_path, capsys):
    port, bodies = free_port(), tmp_path / "bodies.jsonl"
    args = load_args(port, concurrency=[2], sampling=["greedy", "chat", "default"])
    results = run_systems(
        [fake("steady", port, "ok", env={"FAKE_PEER_BODIES": str(bodies)})], args, tmp_path, {}, ready_timeout_s=60
    )
    assert [(r["sampling"], r["concurrency"]) for r in results] == [("greedy", 2), ("chat", 2), ("default", 2)]
    assert all("error" not in r for r in results)
    sent = [json.loads(line) for line in bodies.read_text().splitlines()]
    fields = Counter(tuple(sorted((k, b[k]) for k in ("temperature", "top_p") if k in b)) for b in sent)
    # the warm-up carries the first pass's settings; each pass sends its 2 requests
    assert fields == {(("temperature", 0),): 3, (("temperature", 0.7), ("top_p", 0.9)): 2, (): 2}
    assert SAMPLING["default"] == {} and all(b["ignore_eos"] and b["stream"] for b in sent)
    show(results, args)
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("system"))
    assert "sampling" in header.split()


def test_the_ratio_is_against_the_best_vllm_row_of_the_same_requests_and_sampling(capsys):
    def row(system, tok_s, baseline=None, sampling="greedy", n=32):
        return {
            "system": system,
            "concurrency": n,
            "sampling": sampling,
            "baseline": baseline,
            "tok_s": tok_s,
            "ttft_mean": 1.0,
            "ttft_p50": 1.0,
            "ttft_p99": 1.0,
            "itl_p50": 0.1,
            "itl_p99": 0.1,
            "max_running": 32,
        }

    results = [
        row("latentkv serve", 300.0),
        row("latentkv serve", 90.0, sampling="chat"),
        row("vllm serve (original)", 100.0, "vLLM original"),
        row("vllm serve (original, fp8 KV)", 150.0, "vLLM original"),
        row("vllm serve (original)", 60.0, "vLLM original", sampling="chat"),
        {**row("vllm serve (original, fp8 KV)", 0.0, "vLLM original", sampling="chat"), "error": "refused"},
    ]
    assert baselines(results) == {("vLLM original", 32, "greedy"): 150.0, ("vLLM original", 32, "chat"): 60.0}
    show(results, argparse.Namespace(max_concurrency=None))
    table = printed_rows(capsys.readouterr().out)
    ratio = {(r["system"], r["sampling"]): r["x vs vLLM original"] for r in table}
    assert ratio[("latentkv serve", "greedy")] == "2"  # 300 / 150: fp8, the better vLLM row
    assert ratio[("latentkv serve", "chat")] == "1.5"  # 90 / 60: the fp8 row failed there
    assert ratio[("vllm serve (original)", "greedy")] == "0.667"


def printed_rows(text: str) -> list[dict]:
    """The first table print_table wrote: a title, a header, a line of dashes marking the columns, rows."""
    lines = text.splitlines()
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[2])]
    cut = lambda line: [line[a:b].strip() for a, b in spans]  # noqa: E731
    header = cut(lines[1].ljust(len(lines[2])))
    rows = []
    for line in lines[3:]:
        if not line.strip():
            break
        rows.append(dict(zip(header, cut(line))))
    return rows


def folder_args(model: Path, **kw) -> argparse.Namespace:
    base = dict(
        model=str(model),
        source=None,
        source_given=False,
        dtype="float32",
        systems=None,
        no_baselines=False,
        vllm=sys.executable,
        stock576=None,
        scenario="load",
        concurrency=[1, 32],
        cache_memory="1GiB",
        min_prompt=8,
        max_prompt=64,
        min_output=4,
        max_output=12,
    )
    return argparse.Namespace(**{**base, **kw})


def test_a_folder_that_is_no_conversion_is_served_by_vllm_itself_without_a_source(tmp_path):
    save_tiny_lm(tmp_path / "lm")
    # the command fills in the bundled GGUF when --source is absent: not this folder's source
    args = folder_args(tmp_path / "lm", source="/bundled/SmolLM2.gguf")
    prepare(args)
    assert args.systems == FOLDER_SYSTEMS and args.source is None
    assert (
        args.max_num_seqs == 32
        and args.vocab <= json.loads((tmp_path / "lm" / "config.json").read_text())["vocab_size"]
    )
    named = folder_args(tmp_path / "lm", source=str(tmp_path / "lm"), source_given=True, systems=["latentkv"])
    prepare(named)
    assert named.source == str(tmp_path / "lm")


def test_a_conversion_whose_source_is_gone_asks_for_source(tmp_path):
    save_tiny_lm(tmp_path / "lm")
    (tmp_path / "lm" / "latentkv-source.json").write_text(json.dumps({"source": str(tmp_path / "gone.gguf")}))
    with pytest.raises(SystemExit, match="pass --source"):
        prepare(folder_args(tmp_path / "lm"))
    with pytest.raises(SystemExit, match="vllm-original needs the source"):
        prepare(folder_args(tmp_path / "lm", systems=["latentkv", "vllm-original"]))
    only_ours = folder_args(tmp_path / "lm", systems=["latentkv"])
    prepare(only_ours)
    assert only_ours.systems == ["latentkv"]
