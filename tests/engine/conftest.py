"""Engine test fixtures: tiny DeepSeek checkpoints with a tokenizer (built by
tests/tiny_lm.py), once per session, and one intra-op thread."""
from __future__ import annotations

import pytest
import torch
from tiny_lm import save_tiny_lm


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory):
    """name -> (folder with weights + tokenizer, transformers model, tokenizer)."""
    root = tmp_path_factory.mktemp("tiny_lm")
    built = {}

    def get(name: str = "v3_dense_qlora", tokenizer: bool = True):
        key = (name, tokenizer)
        if key not in built:
            folder = root / f"{name}{'' if tokenizer else '_notok'}"
            built[key] = (folder, *save_tiny_lm(folder, name, tokenizer))
        return built[key]

    return get


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: one intra-op thread is fastest, and on shared, busy cores
    two spinning OpenMP threads were measured 10-30x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
