"""The degenerate-repetition rule on crafted token sequences (characters, words and
punctuation as tokens)."""

import re

import pytest

from latentkv.eval.repetition import MIN_SPAN, distinct_ratio, is_degenerate


def words(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text)


@pytest.mark.parametrize(
    "text, block",
    [
        ("L'Étoile, la cité, le moulin, le moulin, le moulin", 3),  # the last repeat lacks its comma
        ("12 * 12 = 12 * 12 = 12 * 12 = 12 * 12 =", 4),
    ],
)
def test_looping_words_are_flagged(text, block):
    r = is_degenerate(words(text))
    assert r is not None and r.block == block and r.times >= 3 - 1 / block and r.span >= MIN_SPAN


def test_looping_characters_are_flagged_where_the_loop_is():
    tokens = list("The answer is 1.1.1.1.1.1")
    r = is_degenerate(tokens)
    assert r is not None and r.block == 2 and "".join(tokens[r.start : r.start + r.span]) == "1.1.1.1.1.1"


@pytest.mark.parametrize(
    "tokens",
    [
        list("1000000"),  # 6 zeros: a run, but under MIN_SPAN tokens
        words("The capital of France is Paris."),
        words("one, two, three, four, five, six"),  # a list: the separator repeats, the items do not
        words("a b a b"),  # twice only
        list("abcdefab" * 2),  # a block of 8 twice (+ 2): not 3 times
    ],
)
def test_ordinary_text_is_not_flagged(tokens):
    assert is_degenerate(tokens) is None


def test_min_span_and_repeats_are_the_thresholds():
    assert is_degenerate(["x"] * MIN_SPAN) is not None
    assert is_degenerate(["x"] * (MIN_SPAN - 1)) is None
    assert is_degenerate(list("abcdef" * 3)).block == 6
    assert is_degenerate(list("abcdef" * 3)[:-1]).block == 6  # last block one short: still flagged
    assert is_degenerate(list("abcdef" * 3)[:-2]) is None  # two short: not


def test_distinct_ratio():
    assert distinct_ratio(list("abcdef")) == 1.0
    assert distinct_ratio(list("ababab")) == pytest.approx(2 / 5)
    assert distinct_ratio(["a"]) == 1.0
