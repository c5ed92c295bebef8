"""A real latentkv server (uvicorn in a thread, free loopback port) on a tiny random
DeepSeek model with a byte-level BPE tokenizer and a chat template (the engine tests'
tiny model and tokenizer)."""
from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import pytest
import uvicorn

from engine.conftest import build_model, build_tokenizer  # tests/engine/conftest.py
from latentkv.engine.engine import EngineArgs, LLMEngine
from latentkv.server.app import build_app, build_state

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


def start_server(folder, api_key: str | None = None, max_waiting_requests: int = 256, **engine_kwargs) -> RunningServer:
    args = EngineArgs(model=str(folder), dtype="float32", nan_check=True, **engine_kwargs)
    engine = LLMEngine.from_args(args)
    state = build_state(engine, MODEL_NAME, max_waiting_requests, api_key)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    return RunningServer(f"http://127.0.0.1:{port}", state, engine, server, thread)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("server_model") / "tiny"
    build_model("v3_dense_qlora").save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def server(tiny_model_dir):
    """The main test server: room for 16 concurrent sequences, prefix caching on."""
    running = start_server(tiny_model_dir, max_num_seqs=16, max_model_len=256, kv_cache_memory="8MiB")
    yield running
    running.stop()


@pytest.fixture(scope="session")
def client(server):
    from openai import OpenAI
    return OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)
