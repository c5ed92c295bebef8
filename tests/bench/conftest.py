"""Bench test fixtures: `tiny`, the tiny checkpoint the benches run on (tests/conftest.py builds it)."""

import pytest


@pytest.fixture(scope="module")
def tiny(tiny_checkpoints):
    return str(tiny_checkpoints("v3_dense_qlora")[0])
