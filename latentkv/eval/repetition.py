"""The degenerate-repetition rule of `latentkv eval chat` (one rule, one place).

A token sequence degenerates when it contains a periodic run — every token equal to the one n
before it, 1 ≤ n ≤ MAX_BLOCK — spanning at least MIN_REPEATS blocks of n (the last block may
lack its final token, e.g. a closing separator: "le moulin, le moulin, le moulin") and at least
MIN_SPAN tokens: "1.1.1.1.1.1", "12 * 12 = 12 * 12 = 12 * 12 =". MIN_SPAN keeps the short runs
ordinary text has (the digits of 1000000, "..." split into tokens) unflagged.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_BLOCK = 16
MIN_REPEATS = 3
MIN_SPAN = 8
RULE = (
    f"a block of 1-{MAX_BLOCK} tokens repeated >= {MIN_REPEATS} times back to back (the last may lack its "
    f"final token), the run covering >= {MIN_SPAN} tokens"
)


@dataclass(frozen=True)
class Repeat:
    start: int  # index of the run's first token
    block: int  # n: the period
    span: int  # tokens in the run

    @property
    def times(self) -> float:
        return self.span / self.block


def is_degenerate(
    tokens: list, min_repeats: int = MIN_REPEATS, min_span: int = MIN_SPAN, max_block: int = MAX_BLOCK
) -> Repeat | None:
    """The longest periodic run that makes `tokens` degenerate under RULE, or None."""
    best = None
    for n in range(1, max_block + 1):
        i = n
        while i < len(tokens):
            if tokens[i] != tokens[i - n]:
                i += 1
                continue
            j = i
            while j < len(tokens) and tokens[j] == tokens[j - n]:
                j += 1
            span = j - i + n  # tokens i-n .. j-1 have period n
            if span >= max(min_repeats * n - 1, min_span) and (best is None or span > best.span):
                best = Repeat(i - n, n, span)
            i = j
    return best


def distinct_ratio(tokens: list, n: int = 2) -> float:
    """Distinct n-grams / n-grams (1.0 for sequences shorter than n + 1: nothing to compare)."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if len(grams) > 1 else 1.0
