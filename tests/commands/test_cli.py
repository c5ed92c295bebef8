"""`latentkv generate`, `latentkv chat` and `latentkv serve` from the command line."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tiny_lm import save_tiny_lm
from latentkv import LLM, SamplingParams
from latentkv.cli import main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli_model") / "tiny"
    save_tiny_lm(folder)
    return folder


@pytest.fixture(scope="module")
def reference(model_dir):
    return LLM(model=str(model_dir), dtype="float32", kv_cache_memory="4MiB", max_model_len=256)


ENGINE_FLAGS = ["--dtype", "float32", "--kv-cache-memory", "4MiB", "--max-model-len", "256"]


def test_generate_streams_the_greedy_completion(model_dir, reference, capsys):
    code = main(["generate", str(model_dir), "--prompt", "the quick brown", "--max-tokens", "8", *ENGINE_FLAGS])
    out = capsys.readouterr()
    expected = reference.generate(["the quick brown"], SamplingParams(max_tokens=8, temperature=0), use_tqdm=False)[0]
    assert code == 0 and out.out == expected.outputs[0].text + "\n"
    assert "KV bytes per token" in out.err and "cache capacity" in out.err


def test_chat_keeps_history_and_exits(model_dir, reference, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\nand again\n/exit\n"))
    code = main(["chat", str(model_dir), "--temperature", "0", "--max-tokens", "6", *ENGINE_FLAGS])
    out = capsys.readouterr().out
    params = SamplingParams(max_tokens=6, temperature=0)
    first = reference.chat([{"role": "user", "content": "hello"}], params, use_tqdm=False)[0].outputs[0].text
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": first},
        {"role": "user", "content": "and again"},
    ]
    second = reference.chat(history, params, use_tqdm=False)[0].outputs[0].text
    assert code == 0
    assert f"assistant> {first}\n" in out and f"assistant> {second}\n" in out


def test_config_with_an_unknown_key_fails_naming_it(tmp_path, capsys):
    config = tmp_path / "bad.toml"
    config.write_text("[latent_attention]\nchunk_size = 16\n\n[latent_attention.prefetch]\nenabled = true\n")
    for command in ("serve", "generate --prompt x", "chat"):
        assert main([*command.split(), "--config", str(config)]) == 2
        assert "'latent_attention.prefetch.enabled'" in capsys.readouterr().err


def test_unreadable_api_key_file_is_a_clean_error(tmp_path, capsys):
    assert main(["serve", str(tmp_path), "--api-key-file", str(tmp_path / "no-such-key")]) == 2
    assert "no-such-key" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,config,named,allowed",
    [
        (["--kv-cache-dtype", "int3"], None, "--kv-cache-dtype = 'int3'", "fp8_e4m3"),  # bad dtype
        (["--kv-cache-memory", "2 parsecs"], None, "--kv-cache-memory = '2 parsecs'", "GiB"),  # bad unit
        ([], 'kv_cache_memory = "12 furlongs"\n', "kv_cache_memory = '12 furlongs'", "GiB"),
        ([], '[precision]\ncompute = "half"\n', "precision.compute = 'half'", "bfloat16"),
    ],
)
def test_startup_errors_name_the_key_and_allowed_values(tmp_path, capsys, argv, config, named, allowed):
    if config is not None:
        (tmp_path / "c.toml").write_text(config)
        argv = [*argv, "--config", str(tmp_path / "c.toml")]
    for command in ("serve", "generate --prompt x", "chat"):
        assert main([*command.split(), *argv]) == 2
        err = capsys.readouterr().err
        assert named in err and allowed in err


def test_missing_model_is_a_clean_error(tmp_path, capsys):
    for command in ("serve", "chat", "generate --prompt x"):
        assert main([*command.split(), str(tmp_path / "absent")]) == 2
        assert "model not found" in capsys.readouterr().err


def test_serve_subprocess_answers_over_http(model_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "serve.toml"
    config.write_text(
        '[server]\nserved_model_name = "cli-tiny"\n\n[precision]\ncompute = "float32"\n'
        "[latent_attention.memory]\npool_size = 64\n"
    )  # the seed's names: 64 blocks
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "latentkv.cli",
            "serve",
            str(model_dir),
            "--config",
            str(config),
            "--port",
            str(port),
            "--max-model-len",
            "256",
            "--max-request-bytes",
            "2048",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "LATENTKV_API_KEY": "env-key"},
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "server did not come up"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        body = {
            "model": "cli-tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "ignore_eos": True,
        }
        url, key = f"http://127.0.0.1:{port}/v1/chat/completions", {"Authorization": "Bearer env-key"}
        r = httpx.post(url, timeout=60, json=body, headers=key)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        assert httpx.post(url, timeout=60, json=body).status_code == 401  # the key came from $LATENTKV_API_KEY
        big = {**body, "messages": [{"role": "user", "content": "x" * 4096}]}
        assert httpx.post(url, timeout=60, json=big, headers=key).status_code == 413
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "KV bytes per token" in err and "cache capacity 1024 tokens (64 blocks of 16)" in err
