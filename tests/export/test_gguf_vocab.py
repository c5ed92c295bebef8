"""The tokenizer in the GGUF: tokens, types, padding to the model's vocab_size, the pre-tokenizer
llama.cpp needs (detected, or given), and clear errors for what cannot be written."""

from __future__ import annotations

import gguf
import pytest
from tokenizers import pre_tokenizers

from gguf_files import read_gguf, save_deepseek
from latentkv.export import export_gguf
from latentkv.export.gguf_check import ExportError
from latentkv.export.gguf_vocab import pre_tokenizer, tokenizer_spec
from latentkv.sources.gguf_reader import open_reader, read_field
from latentkv.sources.readers import default_gguf_path
from tiny_lm import VOCAB


def test_ids_past_the_tokenizer_are_unused_pad_tokens(tmp_path, tiny_tokenizer):
    folder = save_deepseek(tmp_path / "m", tiny_tokenizer, VOCAB + 80)
    fields, _ = read_gguf(export_gguf(folder, tmp_path / "m.gguf"))
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    assert len(tokens) == len(types) == VOCAB + 80
    assert tokens[VOCAB:] == [f"[PAD{i}]" for i in range(VOCAB, VOCAB + 80)]
    assert set(types[VOCAB:]) == {gguf.TokenType.UNUSED} and gguf.TokenType.UNUSED not in types[:VOCAB]


def test_a_tokenizer_larger_than_the_model_is_refused(tmp_path, tiny_tokenizer):
    folder = save_deepseek(tmp_path / "m", tiny_tokenizer, VOCAB - 20)
    with pytest.raises(ExportError, match=f"tokenizer has id {VOCAB - 1} but the model's vocab_size is {VOCAB - 20}"):
        export_gguf(folder, tmp_path / "m.gguf")


def test_a_folder_without_tokenizer_is_refused(tmp_path):
    folder = save_deepseek(tmp_path / "m", None, VOCAB)
    with pytest.raises(ExportError, match="no tokenizer.json; a GGUF carries its tokenizer"):
        export_gguf(folder, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


def test_an_unknown_pre_tokenizer_asks_for_its_name(tmp_path, tiny_tokenizer):
    tiny_tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    folder = save_deepseek(tmp_path / "m", tiny_tokenizer, VOCAB)
    with pytest.raises(ExportError, match="pass it with --tokenizer-pre NAME"):
        export_gguf(folder, tmp_path / "m.gguf")
    fields, _ = read_gguf(export_gguf(folder, tmp_path / "m.gguf", tokenizer_pre="smollm"))
    assert fields["tokenizer.ggml.pre"] == "smollm"


def test_smollm2_is_recognized_as_llama_cpp_recognizes_it(tmp_path, smollm2_tokenizer):
    """The hash of convert_hf_to_gguf's check text: what the bundled GGUF itself says (smollm)."""
    smollm2_tokenizer.save_pretrained(str(tmp_path))
    written = pre_tokenizer(smollm2_tokenizer, tokenizer_spec(tmp_path), tmp_path)
    assert written == read_field(open_reader(default_gguf_path()), "tokenizer.ggml.pre") == "smollm"
