"""Many streams at once, clients that leave early, and a NaN in the model."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time

import httpx
import openai
import pytest
import torch

from latentkv.server.serving import sse
from server_helpers import MODEL_NAME

PROMPTS = [
    f"{word} {i}"
    for i, word in enumerate(
        [
            "the",
            "quick",
            "brown",
            "fox",
            "jumps",
            "over",
            "lazy",
            "dog",
            "one",
            "two",
            "three",
            "four",
            "héllo",
            "wörld",
            "café",
            "code",
        ]
    )
]


def metric(server, name: str, labels: str = "") -> float:
    text = httpx.get(server.url + "/metrics").text
    match = re.search(rf"^{name}{re.escape(labels)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def wait_until_idle(server, deadline_s: float = 60.0) -> None:
    """Poll /metrics until nothing runs or waits (the engine loop applies aborts async)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if (
            metric(server, "latentkv_num_requests_running") == 0
            and metric(server, "latentkv_num_requests_waiting") == 0
        ):
            return
        time.sleep(0.05)


def test_16_concurrent_streams_equal_their_non_streamed_greedy_text(server, client):
    expected = [
        client.completions.create(
            model=MODEL_NAME, prompt=p, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .text
        for p in PROMPTS
    ]

    async def one(aclient, prompt: str) -> str:
        stream = await aclient.completions.create(
            model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0, stream=True, extra_body={"ignore_eos": True}
        )
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def all_of_them():
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120) as aclient:
            return await asyncio.gather(*(one(aclient, p) for p in PROMPTS))

    assert asyncio.run(all_of_them()) == expected
    assert len(set(expected)) > 1  # the prompts really lead to different texts


def test_closing_a_stream_early_aborts_and_frees_its_blocks(server, client):
    wait_until_idle(server)
    aborted_before = metric(server, "latentkv_request_finish_total", '{reason="abort"}')
    stream = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "talk " * 10}],
        max_tokens=200,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    next(chunks), next(chunks), next(chunks)
    assert metric(server, "latentkv_cache_blocks_used") > 0  # it holds blocks while it runs
    stream.close()
    wait_until_idle(server)
    assert metric(server, "latentkv_cache_blocks_used") == 0
    assert metric(server, "latentkv_request_finish_total", '{reason="abort"}') == aborted_before + 1
    # the server is fine afterwards
    assert client.completions.create(model=MODEL_NAME, prompt="one", max_tokens=3).choices[0].text is not None


@pytest.fixture
def poisoned_token(server):
    """Token id 250's embedding is NaN while the test runs."""
    embed = server.engine.model.model.embed_tokens.weight
    saved = embed[250].clone()
    with torch.no_grad():
        embed[250] = float("nan")
    yield 250
    with torch.no_grad():
        embed[250] = saved


def test_nan_in_the_logits_fails_only_that_request(server, client, poisoned_token):
    good = dict(model=MODEL_NAME, prompt="the quick", max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    expected = client.completions.create(**good).choices[0].text
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model=MODEL_NAME, prompt=[7, poisoned_token, 8, 9], max_tokens=6)
    assert info.value.status_code == 500 and "NaN" in str(info.value)
    with pytest.raises(openai.APIError) as info:  # streamed: an error event instead of garbage text
        list(client.completions.create(model=MODEL_NAME, prompt=[poisoned_token, 3], max_tokens=6, stream=True))
    assert "NaN" in str(info.value)
    assert client.completions.create(**good).choices[0].text == expected
    wait_until_idle(server)
    assert metric(server, "latentkv_cache_blocks_used") == 0
    assert metric(server, "latentkv_request_finish_total", '{reason="error"}') >= 2


def test_a_step_that_raises_once_is_retried_per_sequence_and_nothing_fails(server, client, monkeypatch):
    real_run = server.engine.runner.run
    calls = []

    def run_once_broken(out):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected step failure")
        return real_run(out)

    monkeypatch.setattr(server.engine.runner, "run", run_once_broken)
    expected = (
        client.completions.create(
            model=MODEL_NAME, prompt="one two", max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
        )
        .choices[0]
        .text
    )
    calls.clear()
    again = client.completions.create(
        model=MODEL_NAME, prompt="one two", max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
    )
    assert len(calls) > 1 and again.choices[0].text == expected and again.choices[0].finish_reason == "length"
    wait_until_idle(server)
    assert metric(server, "latentkv_cache_blocks_used") == 0
    assert httpx.get(server.url + "/health").status_code == 200


def test_a_request_that_always_fails_in_the_engine_fails_alone_during_a_stream(server, client, monkeypatch):
    """A bug that only one request triggers (here: any batch holding its poisoned token
    id 311) fails that request with a 500; a concurrent stream finishes intact."""
    real_run = server.engine.runner.run

    def run_poisoned(out):
        if any(311 in s.seq.token_ids for s in out.scheduled):
            raise RuntimeError("injected per-request failure")
        return real_run(out)

    params = dict(
        model=MODEL_NAME, prompt="the quick brown fox", max_tokens=40, temperature=0, extra_body={"ignore_eos": True}
    )
    expected = client.completions.create(**params).choices[0].text
    monkeypatch.setattr(server.engine.runner, "run", run_poisoned)
    errors_before = metric(server, "latentkv_requests_total", '{status="500"}')
    stream = client.completions.create(**params, stream=True)
    chunks = iter(stream)
    text = next(chunks).choices[0].text  # the stream runs
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model=MODEL_NAME, prompt=[5, 311, 7], max_tokens=4)
    assert "injected per-request failure" in str(info.value)
    text += "".join(c.choices[0].text for c in chunks)
    assert text == expected
    assert metric(server, "latentkv_requests_total", '{status="500"}') == errors_before + 1
    wait_until_idle(server)
    assert metric(server, "latentkv_cache_blocks_used") == 0


@pytest.fixture
def paused_engine(server, monkeypatch):
    """The engine blocks inside its next model run until `release` is set."""
    entered, release = threading.Event(), threading.Event()
    real_run = server.engine.runner.run

    def gated_run(out):
        entered.set()
        release.wait(timeout=60)
        return real_run(out)

    monkeypatch.setattr(server.engine.runner, "run", gated_run)
    yield entered, release
    release.set()


def test_a_client_leaving_a_non_streamed_request_aborts_it(server, paused_engine):
    entered, release = paused_engine
    wait_until_idle(server)
    aborted_before = metric(server, "latentkv_request_finish_total", '{reason="abort"}')
    body = json.dumps({"model": MODEL_NAME, "prompt": "one two three", "max_tokens": 50, "ignore_eos": True}).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        assert entered.wait(timeout=60)  # the request is in the engine
    deadline = time.monotonic() + 60
    while server.state.engine.commands.empty() and time.monotonic() < deadline:
        time.sleep(0.02)  # until the server noticed and queued the abort
    release.set()
    wait_until_idle(server)
    assert metric(server, "latentkv_request_finish_total", '{reason="abort"}') == aborted_before + 1
    assert metric(server, "latentkv_cache_blocks_used") == 0


def test_an_event_whose_text_holds_a_unicode_line_separator_stays_one_line():
    """A token may decode to U+2028, U+2029 or NEL, which JSON leaves raw and httpx's aiter_lines (Python's
    str.splitlines) takes for line ends: the event escapes them, so every client reads one JSON line."""
    payload = {"choices": [{"index": 0, "text": "a\u2028b\u2029c\x85d é 日本"}]}
    event = sse(payload)
    lines = [line for line in httpx._decoders.LineDecoder().decode(event) if line]
    assert len(lines) == 1 and json.loads(lines[0].removeprefix("data: ")) == payload
    assert "é 日本" in event  # the rest stays as it was (no ASCII escaping)
