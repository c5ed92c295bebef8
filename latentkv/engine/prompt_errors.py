"""What makes a prompt unusable, as one error type with a machine-readable `code` (the
server answers it as a 400 with that code; `LLM` callers see a ValueError)."""

from __future__ import annotations


class PromptError(ValueError):
    """An unusable prompt; `code` is e.g. "context_length_exceeded", "invalid_token_id"."""

    def __init__(self, message: str, code: str = "invalid_prompt"):
        super().__init__(message)
        self.code = code


def check_token_ids(ids: list[int], vocab_size: int) -> None:
    """Every id in the vocabulary — checked before anything decodes them (a tokenizer given
    2**64 raises OverflowError, not a clean error)."""
    for t in ids:
        if not 0 <= t < vocab_size:
            raise PromptError(
                f"prompt token id {t} is outside the vocabulary (0 <= id < {vocab_size})", code="invalid_token_id"
            )
