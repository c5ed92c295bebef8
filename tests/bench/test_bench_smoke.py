"""Each bench subcommand runs in --quick mode on a tiny model and writes its JSON and PNG (`bench decode`'s
in test_decode.py). No timing assertions: only that the measurements exist and are sane numbers."""

import json
import os
import socket

import pytest

from bench_cli import positive, run_bench
from latentkv.bench import moe_kernel
from latentkv.bench.throughput import make_requests
from latentkv.cli import main
from latentkv.kernels import qlinear
from tiny_lm import VOCAB as LM_VOCAB, save_tiny_lm


def test_bench_throughput(tiny, tmp_path):
    data = run_bench("throughput", tiny, tmp_path, "--not-invariant")
    assert [r["concurrency"] for r in data["results"]] == [1, 4]
    for row in data["results"]:
        assert positive(row["latentkv"]["tok_s"]) and positive(row["transformers"]["tok_s"])
        assert positive(row["latentkv not invariant"]["tok_s"])
        assert row["latentkv not invariant"]["tokens"] == row["latentkv"]["tokens"]
        assert row["latentkv"]["ttft_p50"] <= row["latentkv"]["ttft_p99"]


def test_bench_throughput_with_quantized_weights_and_int8_latent(tiny, tmp_path):
    out = tmp_path / "throughput-w4a8"
    assert (
        main(
            [
                "bench",
                "throughput",
                "--quick",
                "--model",
                tiny,
                "--no-baselines",
                "--quantization",
                "w4a8",
                "--kv-cache-dtype",
                "int8",
                "--concurrency",
                "1",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads((out / "throughput.json").read_text())
    assert [r["concurrency"] for r in data["results"]] == [1, 2]
    assert all(positive(r["latentkv"]["tok_s"]) and "transformers" not in r for r in data["results"])
    assert data["latentkv"] == {"quantization": "w4a8", "kv_cache_dtype": "int8"}


def test_bench_prefix(tiny, tmp_path):
    data = run_bench("prefix", tiny, tmp_path)
    assert [r["prefix"] for r in data["results"]] == [64, 256]
    assert all(positive(r["ttft_on_s"]) and positive(r["ttft_off_s"]) for r in data["results"])
    assert data["results"][-1]["hits"] > 0  # the shared prefix was found in the cache


def test_bench_memory(tiny, tmp_path):
    data = run_bench("memory", tiny, tmp_path)
    caches = {(r["model"], r["cache"]): r["bytes/token"] for r in data["analytic"]}
    v3 = {c: b for (m, c), b in caches.items() if m == "DeepSeek-V3"}
    assert v3["MLA bf16"] == 61 * 576 * 2 and v3["MHA bf16 (same heads)"] == 61 * 2 * 128 * 128 * 2
    measured = data["measured"][0]
    assert positive(measured["latentkv"]["rss_held_mib"]), measured
    assert positive(measured["transformers"]["rss_held_mib"]), measured


def test_bench_kernel(tmp_path):
    out = tmp_path / "kernel"
    assert (
        main(
            [
                "bench",
                "kernel",
                "--quick",
                "--heads",
                "4",
                "--rank",
                "32",
                "--rope",
                "16",
                "--threads",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert (out / "kernel.png").stat().st_size > 0
    data = json.loads((out / "kernel.json").read_text())
    assert data["bandwidth_gbs"] > 0 and "avx2" in data["cpu_flags"]
    assert [(r["latent"], r["batch"], r["context"]) for r in data["results"]] == [
        (data["model_dtype"], 1, 64),
        (data["model_dtype"], 1, 200),
        (data["model_dtype"], 3, 64),
        (data["model_dtype"], 3, 200),
        ("int8", 1, 64),
        ("int8", 1, 200),
        ("int8", 3, 64),
        ("int8", 3, 200),
    ]
    elt = 2 if data["model_dtype"] == "bfloat16" else 4
    per_token = {
        data["model_dtype"]: (32 + 16) * elt,
        "int8": 32 + 4 + 16 * 2,
    }  # rank + rope; codes + scale + bf16 rope
    for row in data["results"]:
        assert row["bytes"] == row["batch"] * row["context"] * per_token[row["latent"]]
        assert positive(row["reference GB/s"]) and positive(row["reference % bw"])
        if data["isa"]:
            assert positive(row["native GB/s"]) and positive(row["native speed-up"])


def test_bench_kernel_times_the_default_conversions_cache_and_query(tmp_path):
    """int8_rope8 (codes and two scales a token, the rope key in int8 too) with the query an exact
    conversion makes (its latent part zero)."""
    out = tmp_path / "kernel"
    argv = ["bench", "kernel", "--quick", "--heads", "3", "--rank", "32", "--rope", "32", "--latents", "int8_rope8"]
    assert main(argv + ["--zero-latent-query", "--threads", "1", "--out", str(out)]) == 0
    data = json.loads((out / "kernel.json").read_text())
    assert data["zero_latent_query"] is True
    assert {r["latent"] for r in data["results"]} == {"int8_rope8"}
    for row in data["results"]:
        assert row["bytes"] == row["batch"] * row["context"] * (32 + 2 * 4 + 32)  # codes, two scales, rope codes
        assert positive(row["reference GB/s"])
        if data["isa"]:
            assert positive(row["native GB/s"])


def test_bench_kernel_moe(tmp_path):
    """--moe: a MoE layer's experts, the native call beside the per-expert loop, by weight kind and batch."""
    if not qlinear.available():
        pytest.skip(f"qlinear not built: {qlinear.unavailable_reason()}")
    out = tmp_path / "kernel"
    assert (
        main(
            [
                "bench",
                "kernel",
                "--quick",
                "--moe",
                "64x40x8x3+1",
                "--moe-weights",
                "int4",
                "bf16",
                "--threads",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    data = json.loads((out / "kernel-moe.json").read_text())
    assert [(r["weights"], r["batch"]) for r in data["results"]] == [("int4", 1), ("int4", 3), ("bf16", 1), ("bf16", 3)]
    for row in data["results"]:
        assert positive(row["native ms"]) and positive(row["reference ms"]) and positive(row["native speed-up"])
        assert positive(row["MiB read"])
        assert row["layers"] == moe_kernel.MAX_LAYERS  # a tiny layer: as many as it may cycle through, not one
    assert data["llc_bytes"] > 0
    for one, three in zip(data["results"][::2], data["results"][1::2]):  # 3 tokens route to at least one's 3 experts
        assert three["MiB read"] >= one["MiB read"]


def test_bench_serve_latentkv_over_the_openai_api(tmp_path):
    """The load client against a real `latentkv serve` on loopback (the vLLM systems need .venv-vllm)."""
    save_tiny_lm(tmp_path / "lm")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = run_bench(
        "serve",
        str(tmp_path / "lm"),
        tmp_path,
        "--systems",
        "latentkv",
        "--threads",
        "1",
        "--cache-memory",
        "16MiB",
        "--port",
        str(port),
    )
    assert [(r["system"], r["concurrency"]) for r in data["results"]] == [("latentkv serve", 1), ("latentkv serve", 4)]
    for row in data["results"]:
        assert positive(row["tok_s"]) and row["ttft_p50"] <= row["ttft_p99"] and row["itl_p50"] <= row["itl_p99"]
        asked = make_requests(row["concurrency"], LM_VOCAB, (8, 64), (4, 12), seed=row["concurrency"])
        assert row["tokens"] == sum(olen for _, olen in asked)


def test_bench_prefix_store(tiny, tmp_path):
    out = tmp_path / "prefix-store"
    assert (
        main(
            [
                "bench",
                "prefix",
                "--store",
                "--quick",
                "--model",
                tiny,
                "--no-baselines",
                "--threads",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert (out / "prefix-store.png").stat().st_size > 0
    data = json.loads((out / "prefix-store.json").read_text())
    assert [r["prefix"] for r in data["ttft"]] == [64, 256]
    for row in data["ttft"]:
        assert positive(row["ttft_cold_s"]) and positive(row["ttft_restored_s"]) and positive(row["speedup"])
        assert row["restored_tokens"] == row["prefix"]  # every full block of the prefix came from disk
    disk = {r["cache"]: r["bytes/token"] for r in data["bytes_per_token"]}
    for name in ("auto", "int8"):  # the bench's cache dtype, and int8 beside it
        assert disk[f"latentkv store on disk, {name} latent"] >= disk[f"latentkv latent in RAM, {name}"]
    assert disk["latentkv store on disk, int8 latent"] < disk["latentkv store on disk, auto latent"]
    assert positive(data["throughput"]["tok_s_store_on"]) and positive(data["throughput"]["tok_s_store_off"])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores: one kept busy, one free")
def test_bench_contention(tiny, tmp_path):
    data = run_bench("contention", tiny, tmp_path, "--threads", "2", "--busy-cores", "1")
    assert data["busy_cores"] == 1 and data["prompt"] == 64
    results = data["results"]
    assert set(results) == {"latentkv (threads: auto)", "latentkv (2 threads)"}  # --source is no GGUF: no llama.cpp
    for phases in results.values():
        assert set(phases) == {"quiet", "busy", "quiet again"}
        assert all(positive(p["tok_s"]) and positive(p["first_tok_s"]) for p in phases.values())
    assert results["latentkv (2 threads)"]["busy"]["threads_after"] == 2  # a fixed count stays fixed
    assert 1 <= results["latentkv (threads: auto)"]["busy"]["threads_after"] <= 2


def test_bench_serve_with_a_response_format(tmp_path):
    """--response-format guides every request; this schema is longer than any asked output, so
    every request still runs to its length."""
    save_tiny_lm(tmp_path / "lm")
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 12, "maxItems": 12}))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = run_bench(
        "serve",
        str(tmp_path / "lm"),
        tmp_path,
        "--systems",
        "latentkv",
        "--threads",
        "1",
        "--cache-memory",
        "16MiB",
        "--port",
        str(port),
        "--response-format",
        str(schema),
    )
    assert data["response_format"]["json_schema"]["schema"]["minItems"] == 12
    for row in data["results"]:
        asked = make_requests(row["concurrency"], LM_VOCAB, (8, 64), (4, 12), seed=row["concurrency"])
        assert row["tokens"] == sum(olen for _, olen in asked)
