"""`latentkv serve` in a subprocess, sent SIGTERM in the middle of a stream: the stream completes
or ends with a well-formed error event, the process exits 0, the KV store holds the prompt's
blocks, and a restarted server answers the same text from them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from tiny_lm import save_tiny_lm

PROMPT = list(range(10, 10 + 4 * 24))  # 24 full blocks of 4 tokens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve_shutdown_model") / "tiny"
    save_tiny_lm(folder)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(model_dir, store, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "latentkv.cli",
            "serve",
            str(model_dir),
            "--port",
            str(port),
            "--served-model-name",
            "tiny",
            "--dtype",
            "float32",
            "--kv-cache-memory",
            "4MiB",
            "--max-model-len",
            "256",
            "--block-size",
            "4",
            "--kv-store",
            str(store),
            "--shutdown-timeout",
            "30",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ.copy(),
    )
    deadline = time.monotonic() + 300  # a hang guard: a busy 2-core machine starts it slowly
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the server did not come up"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)


def stored_blocks(store) -> int:
    return len(list(store.glob("*/blocks/*/*.safetensors")))


def test_sigterm_mid_stream_finishes_cleanly_and_keeps_the_store(model_dir, tmp_path):
    store = tmp_path / "store"
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 100, "temperature": 0, "ignore_eos": True}
    proc = serve(model_dir, store, port)
    try:
        events = []
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as stream:
            lines = stream.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    events.append(line[6:])
                    break
            proc.send_signal(signal.SIGTERM)  # the answer's first token has come
            events += [line[6:] for line in lines if line.startswith("data: ")]
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    if "error" in last:  # ended by the shutdown: OpenAI's error shape
        assert last["error"]["code"] == "server_shutting_down" and last["status"] == 503
    else:
        assert last["choices"][0]["finish_reason"] == "length"
        text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert "shutting down" in err and "queued block(s) written" in err
    assert stored_blocks(store) >= len(PROMPT) // 4

    proc = serve(model_dir, store, port)  # the restart reads the prompt's blocks back
    try:
        again = httpx.post(url, json=body, timeout=120)
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    assert again.status_code == 200
    hits = next(
        float(line.split()[1]) for line in metrics.splitlines() if line.startswith("latentkv_store_hits_total ")
    )
    assert hits >= len(PROMPT) // 4 - 1
    if "error" not in last:
        assert again.json()["choices"][0]["text"] == text
    assert proc.returncode == 0
