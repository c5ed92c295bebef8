"""`--config FILE` (TOML: the options' own names, or the seed template's as aliases) and
flags over it; every start-up error names the key or flag and what is allowed."""

from __future__ import annotations

import argparse

import pytest

from latentkv.settings import (
    Settings,
    SettingsError,
    add_engine_arguments,
    build_settings,
    read_toml,
    settings_from_args,
)

SEED_STYLE = """
model = "some/folder"

[latent_attention]
chunk_size = 32
prefix_caching = false

[latent_attention.memory]
pool_size = 64

[precision]
compute = "float32"
cache = "int8"
weights = "int4"

[scheduler]
max_model_len = 1024
max_num_seqs = 8
max_waiting_requests = 3

[safety]
nan_check = false

[server]
host = "0.0.0.0"
port = 9001
api_key = "k"
served_model_name = "m"
"""


def write(tmp_path, text: str):
    path = tmp_path / "latentkv.toml"
    path.write_text(text)
    return path


def parse(argv: list[str]):
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    return parser.parse_args(argv)


def test_seed_names_map_to_settings(tmp_path):
    s = build_settings(write(tmp_path, SEED_STYLE))
    assert s == Settings(
        model="some/folder",
        dtype="float32",
        kv_cache_dtype="int8",
        quantization="int4",
        block_size=32,
        kv_cache_blocks=64,
        max_model_len=1024,
        max_num_seqs=8,
        max_waiting_requests=3,
        enable_prefix_caching=False,
        nan_check=False,
        host="0.0.0.0",
        port=9001,
        api_key="k",
        served_model_name="m",
    )


def test_defaults_without_a_file():
    s = build_settings()
    assert (s.block_size, s.kv_cache_dtype, s.nan_check, s.enable_prefix_caching, s.host, s.port) == (
        16,
        None,
        True,
        True,
        "127.0.0.1",
        8000,
    )


CANONICAL = """
model = "some/folder"
dtype = "float32"
kv_cache_dtype = "int8"
quantization = "int4"
block_size = 32
kv_cache_blocks = 64
max_model_len = 1024
max_num_seqs = 8
max_waiting_requests = 3
enable_prefix_caching = false
nan_check = false
host = "0.0.0.0"
port = 9001
api_key = "k"
served_model_name = "m"
"""


def test_options_own_names_equal_the_seed_aliases(tmp_path):
    assert build_settings(write(tmp_path, CANONICAL)) == build_settings(write(tmp_path, SEED_STYLE))


def test_pool_size_counts_blocks_and_memory_is_bytes(tmp_path):
    s = build_settings(write(tmp_path, "[latent_attention.memory]\npool_size = 256\n"))
    assert s.kv_cache_blocks == 256 and s.kv_cache_memory is None
    s = build_settings(write(tmp_path, 'kv_cache_memory = "1GiB"\n'))
    assert s.kv_cache_memory == 2**30 and s.kv_cache_blocks is None  # parsed once, here
    with pytest.raises(SettingsError, match="pool_size = '64MiB'.*kv_cache_memory"):
        read_toml(write(tmp_path, '[latent_attention.memory]\npool_size = "64MiB"\n'))


def test_settings_become_engine_args_by_name(tmp_path):
    s = build_settings(write(tmp_path, CANONICAL))
    args = s.engine_args("folder", "fp8")
    assert (
        args.model,
        args.kv_cache_dtype,
        args.dtype,
        args.quantization,
        args.block_size,
        args.kv_cache_blocks,
        args.max_model_len,
        args.max_num_seqs,
        args.enable_prefix_caching,
        args.nan_check,
    ) == ("folder", "fp8_e4m3", "float32", "int4", 32, 64, 1024, 8, False, False)


def test_unknown_key_names_it_and_the_allowed_ones(tmp_path):
    with pytest.raises(SettingsError) as info:
        read_toml(write(tmp_path, "[latent_attention]\nchunk_size = 16\nlookahead = 3\n"))
    message = str(info.value)
    assert "'latent_attention.lookahead'" in message and "latent_attention.chunk_size" in message
    with pytest.raises(SettingsError, match="'fallback.threshold'"):
        read_toml(write(tmp_path, "[fallback]\nthreshold = 0.85\n"))


@pytest.mark.parametrize(
    "text,key,allowed",
    [
        ('[precision]\ncache = "int4"\n', "precision.cache", "fp8_e4m3"),
        ('[precision]\nweights = "int3"\n', "precision.weights", "int4"),
        ("[latent_attention]\nchunk_size = 24\n", "latent_attention.chunk_size", "16"),
        ('[safety]\nnan_check = "maybe"\n', "safety.nan_check", "true or false"),
        ("[scheduler]\nmax_num_seqs = 0\n", "scheduler.max_num_seqs", "positive"),
        ('[latent_attention.memory]\npool_size = "lots"\n', "latent_attention.memory.pool_size", "blocks"),
        ("[server]\nport = 70000\n", "server.port", "0-65535"),
        # a bad unit, a bad dtype: named, with what is allowed (no silent "auto" for a float cache dtype)
        ('kv_cache_memory = "2 parsecs"\n', "kv_cache_memory", "GiB"),
        ('kv_cache_memory = "-1GiB"\n', "kv_cache_memory", "positive"),
        ('kv_cache_dtype = "float16"\n', "kv_cache_dtype", "'bfloat16' / 'float32': the unquantized latent"),
        ('[precision]\ncache = "fp16"\n', "precision.cache", "fp8_e4m3"),
        ('dtype = "float8"\n', "dtype", "bfloat16"),
        ('[precision]\ncompute = "half"\n', "precision.compute", "float16"),
    ],
)
def test_bad_values_name_key_and_allowed_values(tmp_path, text, key, allowed):
    with pytest.raises(SettingsError) as info:
        read_toml(write(tmp_path, text))
    assert key in str(info.value) and allowed in str(info.value)


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "block_size = 8\n[latent_attention]\nchunk_size = 8\n",
            "'block_size' and 'latent_attention.chunk_size' both set",
        ),
        ('kv_cache_memory = "1GiB"\n[latent_attention.memory]\npool_size = 64\n', "both size the latent cache"),
    ],
)
def test_contradictions_are_errors(tmp_path, text, message):
    with pytest.raises(SettingsError, match=message):
        read_toml(write(tmp_path, text))


def test_invalid_toml_and_missing_file(tmp_path):
    with pytest.raises(SettingsError, match="not valid TOML"):
        read_toml(write(tmp_path, "[precision\n"))
    with pytest.raises(SettingsError, match="not found"):
        read_toml(tmp_path / "absent.toml")


def test_flags_override_the_file(tmp_path):
    path = write(tmp_path, SEED_STYLE)
    args = parse(
        [
            "other/model",
            "--config",
            str(path),
            "--kv-cache-dtype",
            "fp8",
            "--block-size",
            "8",
            "--enable-prefix-caching",
            "--kv-cache-memory",
            "1GiB",
            "--quantization",
            "none",
        ]
    )
    s = settings_from_args(args)
    assert (s.model, s.kv_cache_dtype, s.block_size, s.enable_prefix_caching, s.kv_cache_memory, s.quantization) == (
        "other/model",
        "fp8_e4m3",
        8,
        True,
        2**30,
        None,
    )
    assert s.kv_cache_blocks is None  # the flag sized the cache: the file's pool_size is replaced
    assert (s.max_num_seqs, s.nan_check) == (8, False)  # not given as flags: the file's values
    with pytest.raises(SettingsError, match="--block-size = 3 .*allowed: one of"):
        settings_from_args(parse(["--block-size", "3"]))
    with pytest.raises(SettingsError, match="--kv-cache-dtype = 'fp16' .*int8"):
        settings_from_args(parse(["--kv-cache-dtype", "fp16"]))
    with pytest.raises(SettingsError, match="--kv-cache-memory = '2 parsecs'"):
        settings_from_args(parse(["--kv-cache-memory", "2 parsecs"]))
    with pytest.raises(SettingsError, match="both size the latent cache"):
        settings_from_args(parse(["--kv-cache-memory", "1GiB", "--kv-cache-blocks", "8"]))


def test_server_hardening_options(tmp_path):
    s = build_settings(
        write(
            tmp_path, '[server]\nmax_request_bytes = 2048\nmetrics_public = true\napi_key_file = "/run/secrets/key"\n'
        )
    )
    assert (s.max_request_bytes, s.metrics_public, s.api_key_file) == (2048, True, "/run/secrets/key")
    assert Settings().max_request_bytes == 4 * 2**20 and Settings().metrics_public is False
    with pytest.raises(SettingsError, match="server.max_request_bytes = 0 .*positive"):
        read_toml(write(tmp_path, "[server]\nmax_request_bytes = 0\n"))
    args = argparse.ArgumentParser()
    add_engine_arguments(args, server=True)
    flags = settings_from_args(args.parse_args(["--metrics-public", "--max-request-bytes", "100"]))
    assert (flags.metrics_public, flags.max_request_bytes) == (True, 100)


def test_shutdown_timeout_from_file_and_flag(tmp_path):
    assert Settings().shutdown_timeout == 30.0
    assert build_settings(write(tmp_path, "[server]\nshutdown_timeout = 5\n")).shutdown_timeout == 5.0
    for bad in ("-1", "nan", "inf"):
        with pytest.raises(SettingsError, match="server.shutdown_timeout .*seconds >= 0"):
            read_toml(write(tmp_path, f"[server]\nshutdown_timeout = {bad}\n"))
    args = argparse.ArgumentParser()
    add_engine_arguments(args, server=True)
    assert settings_from_args(args.parse_args(["--shutdown-timeout", "0"])).shutdown_timeout == 0.0
    with pytest.raises(SettingsError, match="--shutdown-timeout = -2.0"):
        settings_from_args(args.parse_args(["--shutdown-timeout", "-2"]))
    assert not hasattr(parse([]), "shutdown_timeout")  # serve's own: chat and generate have none
