"""GGUF export fixtures: DeepSeek folders whose tokenizer is not the tiny one."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from gguf_files import save_deepseek
from latentkv.sources.readers import default_gguf_path
from tiny_lm import build_tokenizer


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """The bundled SmolLM2's tokenizer (49152 tokens) as transformers builds it from the GGUF, the way
    a folder converted from it gets its tokenizer files."""
    gguf = default_gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


@pytest.fixture(scope="session")
def padded_vocab(tmp_path_factory, smollm2_tokenizer):
    """A DeepSeek-V2-sized vocabulary (102400 rows) with SmolLM2's 49152-token tokenizer."""
    return save_deepseek(tmp_path_factory.mktemp("padded") / "m", smollm2_tokenizer, 102400)


@pytest.fixture
def tiny_tokenizer():
    return build_tokenizer()
