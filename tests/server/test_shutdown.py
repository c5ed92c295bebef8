"""Graceful shutdown (server/shutdown.py), in-process: `RunningServer.terminate` is what SIGTERM
does. While draining, new requests get 503 + Retry-After and /health is not ready; requests in
flight finish, or past --shutdown-timeout end with a well-formed error; the KV store's queue is
on disk when the server has stopped. The subprocess version is tests/commands/test_serve_shutdown.py."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from latentkv.server import shutdown
from server_helpers import MODEL_NAME, start_server

BODY = {"model": MODEL_NAME, "prompt": "the quick brown fox", "max_tokens": 12, "temperature": 0, "ignore_eos": True}


def until(condition, what: str, deadline_s: float = 60.0) -> None:
    """Poll until `condition()` holds (a guard against hanging, not a timing check)."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.02)


@pytest.fixture
def paused(monkeypatch):
    """-> gate(server): its engine blocks inside its next model run until `release` is set."""
    entered, release = threading.Event(), threading.Event()

    def gate(server):
        real_run = server.engine.runner.run

        def gated_run(out):
            entered.set()
            release.wait(timeout=60)
            return real_run(out)

        monkeypatch.setattr(server.engine.runner, "run", gated_run)
        return entered, release

    yield gate
    release.set()


def post_in_thread(url: str, body: dict) -> dict:
    """POST in a background thread; -> {"response": httpx.Response} once it answers."""
    result: dict = {}

    def post():
        result["response"] = httpx.post(url, json=body, timeout=120)

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    result["thread"] = thread
    return result


def sse_events(lines) -> list:
    """The data of each server-sent event, JSON-decoded ("[DONE]" as is)."""
    return [line[6:] if line == "data: [DONE]" else json.loads(line[6:]) for line in lines if line.startswith("data: ")]


def test_draining_refuses_new_requests_and_lets_running_ones_finish(tiny_model_dir, paused):
    server = start_server(tiny_model_dir, max_model_len=256, kv_cache_memory="8MiB")
    entered, release = paused(server)
    try:
        with httpx.stream(
            "POST", server.base_url + "/completions", json={**BODY, "stream": True}, timeout=120
        ) as stream:
            assert stream.status_code == 200
            assert entered.wait(timeout=60)
            other = post_in_thread(server.base_url + "/completions", BODY)  # queued behind the held step
            until(lambda: server.state.drain.in_flight == 2, "both requests in flight")
            server.terminate()
            until(lambda: httpx.get(server.url + "/health").status_code == 503, "/health not ready")
            assert httpx.get(server.url + "/health").json() == {"status": "draining"}
            refused = httpx.post(
                server.base_url + "/chat/completions",
                timeout=60,
                json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert refused.status_code == 503 and refused.headers["Retry-After"].isdigit()
            assert refused.json()["error"]["code"] == "server_shutting_down"
            assert refused.json()["error"]["type"] == "server_error"
            release.set()
            events = sse_events(stream.iter_lines())
        other["thread"].join(timeout=60)
        assert other["response"].status_code == 200
        assert other["response"].json()["choices"][0]["finish_reason"] == "length"
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
        server.thread.join(timeout=60)
        assert not server.thread.is_alive()  # the server stopped by itself
        assert server.engine.pool.num_used == 0
    finally:
        release.set()
        server.stop()


def test_requests_past_the_shutdown_timeout_end_with_a_well_formed_error(tiny_model_dir, paused):
    server = start_server(tiny_model_dir, max_model_len=256, kv_cache_memory="8MiB", shutdown_timeout=0)
    entered, release = paused(server)
    try:
        with httpx.stream(
            "POST", server.base_url + "/completions", json={**BODY, "stream": True}, timeout=120
        ) as stream:
            assert entered.wait(timeout=60)
            other = post_in_thread(
                server.base_url + "/chat/completions",
                {
                    "model": MODEL_NAME,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 12,
                    "ignore_eos": True,
                },
            )
            until(lambda: server.state.drain.in_flight == 2, "both requests in flight")
            server.terminate()
            until(lambda: server.state.engine.refusing is not None, "the drain ended what runs")
            release.set()
            events = sse_events(stream.iter_lines())
        other["thread"].join(timeout=60)
        response = other["response"]
        assert response.status_code == 503 and response.headers["Retry-After"].isdigit()
        assert response.json()["error"]["code"] == "server_shutting_down"
        assert events[-1] == "[DONE]"
        error = events[-2]
        assert error["status"] == 503 and error["error"]["code"] == "server_shutting_down"
        assert set(error["error"]) == {"message", "type", "param", "code"}
        assert all("choices" in e for e in events[:-2])  # text chunks, then the error
        server.thread.join(timeout=60)
        assert not server.thread.is_alive()
        assert server.engine.pool.num_used == 0  # the ended requests' blocks are free
    finally:
        release.set()
        server.stop()


def test_shutdown_writes_the_queued_store_blocks(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The writer is held in its first write while the request's blocks queue behind it; the
    shutdown begins with them queued and the server stops only once they are on disk."""
    store_dir = tmp_path / "store"
    server = start_server(
        tiny_model_dir, max_model_len=256, kv_cache_memory="2MiB", block_size=4, kv_store=str(store_dir)
    )
    tier = server.engine.store
    started, release = threading.Event(), threading.Event()
    real_write = tier.store.write

    def held_write(block):
        started.set()
        release.wait(timeout=60)
        return real_write(block)

    monkeypatch.setattr(tier.store, "write", held_write)
    try:
        prompt = list(range(10, 10 + 4 * 10))  # 10 full blocks
        r = httpx.post(server.base_url + "/completions", json={**BODY, "prompt": prompt, "max_tokens": 2}, timeout=60)
        assert r.status_code == 200
        assert started.wait(timeout=60)
        assert tier.writer.queue.qsize() > 0  # blocks wait behind the held write
        server.terminate()
        release.set()
        server.thread.join(timeout=60)
        assert not server.thread.is_alive() and not tier.writer.thread.is_alive()
        assert len(list(store_dir.glob("*/blocks/*/*.safetensors"))) >= 10
        assert tier.counters.write_drops == 0
        assert "queued block(s) written, 0 dropped" in capsys.readouterr().err
    finally:
        release.set()
        server.stop()


def test_a_second_signal_exits_at_once(tiny_model_dir, paused, monkeypatch):
    exits = []
    monkeypatch.setattr(shutdown.os, "_exit", exits.append)  # os._exit would end the test run
    server = start_server(tiny_model_dir, max_model_len=256, kv_cache_memory="8MiB")
    entered, release = paused(server)
    try:
        with httpx.stream("POST", server.base_url + "/completions", json={**BODY, "stream": True}, timeout=120):
            assert entered.wait(timeout=60)
            server.terminate()
            assert exits == []  # the first one drains
            server.terminate()
            assert exits == [128 + 15]
            release.set()
    finally:
        release.set()
        server.stop()
