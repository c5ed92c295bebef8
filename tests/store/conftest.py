"""Store test fixtures: tiny checkpoints with a tokenizer (tests/tiny_lm.py), built once."""

from __future__ import annotations

import pytest
from tiny_lm import save_tiny_lm


@pytest.fixture(scope="session")
def lm_folder(tmp_path_factory):
    """name -> folder with a tiny model and its tokenizer."""
    root = tmp_path_factory.mktemp("store_lm")
    built = {}

    def get(name: str = "v3_dense_qlora"):
        if name not in built:
            built[name] = root / name
            save_tiny_lm(built[name], name)
        return built[name]

    return get
