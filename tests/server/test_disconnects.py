"""Clients that go away: under load (32 streams on 16 running slots), half the streams are cut at
random points, from before the first event to mid-answer. Every cut stream's sequence is
aborted, the others finish whole, and afterwards no block is held and nothing waits."""

from __future__ import annotations

import asyncio
import json
import random
import socket

import httpx

from latentkv.server.serving import EngineStream
from server_helpers import MODEL_NAME
from test_streaming import PROMPTS, metric, wait_until_idle

MAX_TOKENS = 200  # far more than a cut stream reads: it cannot finish before its abort lands


async def stream_one(client: httpx.AsyncClient, i: int, cut_after: int | None) -> str:
    """One streamed request; cut_after: close the connection after that many events (None: read all).
    -> "cut", or the finish reason of a stream read to its end."""
    chat = i % 2 == 0
    body = {"model": MODEL_NAME, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True}
    if chat:
        body["messages"] = [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]
    else:
        body["prompt"] = PROMPTS[i % len(PROMPTS)]
    path = "/chat/completions" if chat else "/completions"
    finish = None
    events = 0
    async with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if cut_after is not None and events >= cut_after:
                return "cut"  # leaving the block closes the connection mid-answer
            if not line.startswith("data: "):
                continue
            events += 1
            if line == "data: [DONE]":
                return finish or "no finish reason"
            data = json.loads(line[6:])
            assert "error" not in data, data
            for choice in data["choices"]:
                finish = choice.get("finish_reason") or finish
    return "ended without [DONE]"


def cut_before_the_answer(server, i: int) -> None:
    """Send a streamed request and close the socket before the response can have started."""
    body = json.dumps(
        {
            "model": MODEL_NAME,
            "prompt": PROMPTS[i % len(PROMPTS)],
            "max_tokens": MAX_TOKENS,
            "ignore_eos": True,
            "stream": True,
        }
    ).encode()
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )


def test_half_of_32_streams_cut_at_random_points_free_everything(server):
    wait_until_idle(server)
    aborted_before = metric(server, "latentkv_request_finish_total", '{reason="abort"}')
    rng = random.Random(7)
    cut = set(rng.sample(range(32), 16))
    # cut points: 4 before the answer starts (the socket closed right after the request), 12 in it
    raw_cuts = sorted(cut)[:4]
    plan = {i: (rng.choice([0, 1, 2, 5, 9, 20]) if i in cut and i not in raw_cuts else None) for i in range(32)}

    async def run_all():
        async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as client:
            streamed = asyncio.gather(*(stream_one(client, i, plan[i]) for i in range(32) if i not in raw_cuts))
            for i in raw_cuts:
                await asyncio.to_thread(cut_before_the_answer, server, i)
            return await streamed

    outcomes = asyncio.run(run_all())
    assert sorted(outcomes).count("cut") == len(cut) - len(raw_cuts)
    assert [o for o in outcomes if o != "cut"] == ["length"] * 16  # the others finished whole
    wait_until_idle(server)
    assert metric(server, "latentkv_num_requests_running") == 0
    assert metric(server, "latentkv_num_requests_waiting") == 0
    assert metric(server, "latentkv_cache_blocks_used") == 0
    assert metric(server, "latentkv_request_finish_total", '{reason="abort"}') == aborted_before + 16
    assert server.engine.pool.num_used == 0 and not server.state.engine.streams


def test_a_stream_whose_client_left_at_its_start_is_aborted_by_the_response():
    """The window the test above rarely hits: the disconnect is seen as the response starts, and
    the body is cancelled before or at its first event: its generator is then closed only when the
    collector finalizes it, if it ran at all. The response aborts the engine requests itself."""
    aborted = []

    class Engine:
        streams = {"cmpl-1-0": object()}  # (the engine thread's dict of requests it runs)

        def abort(self, request_id):
            aborted.append(request_id)

    async def body():
        yield "data: {}\n\n"

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        pass

    state = type("State", (), {"engine": Engine()})()
    sub = type("Sub", (), {"request_id": "cmpl-1-0"})()
    response = EngineStream(body(), state, [sub])
    asyncio.run(response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, send))
    assert aborted == ["cmpl-1-0"]
