"""Engine test fixtures: one intra-op thread (the tiny checkpoints with a tokenizer, `tiny_lm`, are
tests/conftest.py's)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: one intra-op thread is fastest, and on shared, busy cores
    two spinning OpenMP threads were measured 10-30x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
