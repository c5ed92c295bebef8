"""A real latentkv server on a tiny random DeepSeek model with a byte-level BPE tokenizer
and a chat template (the engine tests' tiny model and tokenizer)."""
from __future__ import annotations

import pytest

from tiny_lm import build_model, build_tokenizer
from server_helpers import start_server


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
