"""Start a real latentkv server (uvicorn in a thread, free loopback port) for tests."""

from __future__ import annotations

import signal
import socket
import threading
import time
from dataclasses import dataclass

import uvicorn

from latentkv.engine.engine import EngineArgs, LLMEngine
from latentkv.server.app import build_app, build_state
from latentkv.server.shutdown import DrainingServer
from latentkv.settings import DEFAULT_MAX_REQUEST_BYTES

MODEL_NAME = "tiny-mla"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    url: str
    state: object
    engine: LLMEngine
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def terminate(self) -> None:
        """What SIGTERM does to `latentkv serve` (a thread cannot take the signal itself)."""
        self.server.handle_exit(signal.SIGTERM, None)


def start_server(
    folder,
    api_key: str | None = None,
    max_waiting_requests: int = 256,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    metrics_public: bool = False,
    shutdown_timeout: float = 30.0,
    **engine_kwargs,
) -> RunningServer:
    args = EngineArgs(**{"model": str(folder), "dtype": "float32", "nan_check": True, **engine_kwargs})
    engine = LLMEngine.from_args(args)
    state = build_state(
        engine, MODEL_NAME, max_waiting_requests, api_key, max_request_bytes, metrics_public, shutdown_timeout
    )
    port = free_port()
    config = uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_level="warning")
    server = DrainingServer(config, state.drain, state.engine)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return RunningServer(f"http://127.0.0.1:{port}", state, engine, server, thread)
