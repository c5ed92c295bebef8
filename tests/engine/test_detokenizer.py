import random

import pytest
from transformers.tokenization_utils_tokenizers import TokenizersBackend

from latentkv.engine import detokenizer
from latentkv.engine.folder import load_tokenizer


@pytest.mark.parametrize("skip_special_tokens", [False, True])
def test_decode_gives_transformers_text(tiny_lm, skip_special_tokens):
    """decode calls the Rust tokenizer directly for a TokenizersBackend: the text of transformers' own
    decode (without clean-up) on any ids, special tokens and incomplete characters included."""
    folder, _, _ = tiny_lm("v3_dense_qlora")
    tok = load_tokenizer(str(folder))
    assert type(tok)._decode is TokenizersBackend._decode  # the direct call is what this test checks
    rng = random.Random(0)
    specials = tok.all_special_ids
    for n in (0, 1, 2, 7, 40):
        ids = [rng.randrange(len(tok)) for _ in range(n)] + specials[: n % 3]
        rng.shuffle(ids)
        want = tok.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)
        assert detokenizer.decode(tok, ids, skip_special_tokens) == want


class OwnDecode(TokenizersBackend):
    def _decode(self, token_ids, skip_special_tokens=False, **kwargs):
        return "own:" + super()._decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)


def test_a_tokenizer_with_its_own_decode_keeps_it(tiny_lm):
    folder, _, _ = tiny_lm("v3_dense_qlora")
    tok = load_tokenizer(str(folder))
    tok.__class__ = OwnDecode
    assert detokenizer.decode(tok, [5, 6], False).startswith("own:")
