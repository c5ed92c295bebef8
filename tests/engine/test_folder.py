"""A model folder's tokenizer and generation config: a broken file is an error naming it."""

import pytest

from latentkv.engine.folder import find_eos_token_ids, load_tokenizer
from tiny_lm import build_tokenizer


def test_garbage_tokenizer_and_generation_config_name_the_file(tmp_path):
    folder = tmp_path / "tok"
    build_tokenizer().save_pretrained(folder)
    assert load_tokenizer(str(folder)) is not None
    (folder / "tokenizer.json").write_text("this is not a tokenizer")
    with pytest.raises(ValueError) as err:
        load_tokenizer(str(folder))
    assert str(folder / "tokenizer.json") in str(err.value)
    (folder / "generation_config.json").write_text('{"eos_token_id": "two"}')
    with pytest.raises(ValueError, match="generation_config.json: eos_token_id"):
        find_eos_token_ids(folder, None, None)
