"""The public import surface; behaviour tests of `LLM` live in tests/engine/test_llm_api.py
(they need the tiny model + tokenizer fixture there)."""

import pytest

import latentkv
from latentkv.engine.outputs import RequestOutput
from latentkv.llm import LLM
from latentkv.sampling_params import SamplingParams


def test_public_names():
    assert latentkv.LLM is LLM and latentkv.SamplingParams is SamplingParams and latentkv.RequestOutput is RequestOutput
    with pytest.raises(AttributeError):
        latentkv.NoSuchThing


def test_missing_model_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="config.json"):
        latentkv.LLM(str(tmp_path / "nowhere"), kv_cache_memory="1MiB")
