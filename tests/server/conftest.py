"""A real latentkv server on a tiny random DeepSeek model with a byte-level BPE tokenizer
and a chat template (the engine tests' tiny model and tokenizer)."""

from __future__ import annotations

import pytest

from tiny_lm import save_tiny_lm
from server_helpers import start_server


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("server_model") / "tiny"
    save_tiny_lm(folder)
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
