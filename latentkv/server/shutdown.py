"""Graceful shutdown of `latentkv serve` on SIGTERM / SIGINT.

The first signal starts a drain. The listening socket stays open, so a new generation request
gets a clear 503 with Retry-After (code `server_shutting_down`) instead of a refused
connection, and /health answers 503 "draining", so a load balancer takes the replica out.
Requests already in flight, streamed or not, run on. When they are all done, or
`shutdown_timeout` seconds have passed, whatever still runs is ended (`AsyncEngine.end_all`:
a stream gets an error event in OpenAI's format and then [DONE], a non-streamed request a 503),
uvicorn is told to exit, and the app's lifespan stops the engine thread and writes the KV
store's whole queue to disk (bounded by the same timeout; the blocks written and dropped are
logged). A second signal exits at once, with status 128 + the signal's number.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Callable

import uvicorn

from latentkv.server.async_engine import AsyncEngine, ShutdownError
from latentkv.server.guard import send_error

GENERATE_PATHS = ("/v1/completions", "/v1/chat/completions")
ENDING_GRACE = 5.0  # seconds the ended requests get to send their 503 / error event


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Drain:
    """The shutdown's state, shared by the gate, /health and the server: whether it drains,
    how many generation requests are in flight (counted on the event loop), the deadline."""

    def __init__(self, timeout: float = 30.0):
        self.timeout = timeout
        self.draining = False
        self.in_flight = 0
        self.started: float | None = None

    def begin(self) -> None:
        self.draining, self.started = True, time.monotonic()

    def remaining(self) -> float:
        """Seconds left for in-flight requests (the whole timeout before the drain began)."""
        if self.started is None:
            return self.timeout
        return max(0.0, self.timeout - (time.monotonic() - self.started))

    async def run(self, engine: AsyncEngine, exit_server: Callable[[], None]) -> None:
        """Wait for in-flight requests (up to the timeout), end the rest, then let the server exit."""
        log(
            f"latentkv: shutting down: {self.in_flight} request(s) in flight may finish within {self.timeout:g} s; "
            "new requests get 503 (a second signal exits at once)"
        )
        while self.in_flight and self.remaining() > 0:
            await asyncio.sleep(0.05)
        if self.in_flight:
            log(f"latentkv: ending {self.in_flight} request(s) still running after {self.timeout:g} s")
        # also when none runs: a request tokenized at this moment is refused, not started
        engine.end_all(
            ShutdownError(
                f"the server is shutting down: the request did not finish within the "
                f"shutdown timeout ({self.timeout:g} s); retry it"
            )
        )
        grace = time.monotonic() + ENDING_GRACE
        while self.in_flight and time.monotonic() < grace:
            await asyncio.sleep(0.05)
        exit_server()


class DrainGate:
    """ASGI middleware: counts generation requests in flight (a stream until its last byte);
    while the server drains, refuses new ones with 503 + Retry-After in OpenAI's format."""

    def __init__(self, app, drain: Drain):
        self.app = app
        self.drain = drain

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in GENERATE_PATHS:
            return await self.app(scope, receive, send)
        if self.drain.draining:
            return await send_error(
                send,
                503,
                "the server is shutting down and takes no new requests; retry later",
                "server_error",
                code="server_shutting_down",
                headers={"Retry-After": "1"},
            )
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the drain above in place of its own signal handling (which stops
    listening at once and, after the server returns, raises the signal again: exit status 143,
    not 0). `handle_exit` may also be called from another thread (the tests do)."""

    def __init__(self, config: uvicorn.Config, drain: Drain, engine: AsyncEngine):
        super().__init__(config)
        self.drain = drain
        self.engine = engine
        self.loop: asyncio.AbstractEventLoop | None = None
        self.drain_task: asyncio.Task | None = None

    async def startup(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame) -> None:
        if self.drain.draining:
            log(f"latentkv: second signal ({sig}): exiting now; requests in flight and queued KV store writes are lost")
            os._exit(128 + sig)
        if self.loop is None:  # not serving yet: nothing to drain
            self.should_exit = True
            return
        self.drain.begin()
        self.loop.call_soon_threadsafe(self.start_drain)

    def start_drain(self) -> None:
        self.drain_task = asyncio.ensure_future(self.drain.run(self.engine, self.exit_now))

    def exit_now(self) -> None:
        self.should_exit = True


def close_engine(engine, timeout: float) -> None:
    """Write the KV store's queue (within `timeout` s) and say what was written and dropped."""
    report = engine.close(timeout)
    if report is not None:
        log(
            f"latentkv: KV store: {report.written} queued block(s) written, {report.dropped} dropped "
            f"({report.seconds:.1f} s)"
        )
