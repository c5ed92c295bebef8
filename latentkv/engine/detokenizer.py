"""Incremental detokenization and stop-string handling.

Byte-level tokenizers split one character over several tokens; decoding a prefix of
them yields a replacement character '\ufffd'. We decode a short window
`token_ids[prefix_offset:]` and emit only what it adds to `token_ids[prefix_offset:
read_offset]`, holding the new text back while it ends in '\ufffd' (the character is
not complete yet). The window starts a few prompt tokens back so that tokenizers whose
decoding depends on the left context (leading spaces) decode outputs as in context.
"""

from __future__ import annotations

from transformers.tokenization_utils_tokenizers import TokenizersBackend

from latentkv.engine.sequence import Sequence


def decode(tokenizer, ids: list[int], skip_special_tokens: bool) -> str:
    # Without clean-up, a TokenizersBackend's decode is its Rust tokenizer's (transformers' _decode): called
    # directly it skips the Python around it (~2/3 of a call; twice per sequence per step at 32 in flight,
    # ~0.4 ms of a SmolLM2 step). A tokenizer class with its own _decode keeps transformers' decode.
    if type(tokenizer)._decode is TokenizersBackend._decode:
        return tokenizer.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
    return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)


def detokenize_incrementally(tokenizer, seq: Sequence, flush: bool = False, end: int | None = None) -> str:
    """Append to `seq.text` what the newest tokens (those before `end`) complete; `flush`
    emits even an incomplete tail (the sequence is finishing). Returns the new text."""
    skip = seq.params.skip_special_tokens
    end = len(seq.token_ids) if end is None else end
    prefix_text = decode(tokenizer, seq.token_ids[seq.prefix_offset : seq.read_offset], skip)
    full_text = decode(tokenizer, seq.token_ids[seq.prefix_offset : end], skip)
    if len(full_text) <= len(prefix_text) or (full_text.endswith("\ufffd") and not flush):
        return ""
    new_text = full_text[len(prefix_text) :]
    seq.prefix_offset, seq.read_offset = seq.read_offset, end
    seq.text += new_text
    return new_text


def find_stop_string(seq: Sequence, num_new_chars: int) -> bool:
    """If a stop string now occurs in `seq.text` (searching only where new text could
    complete one), cut the text before it, record it and return True."""
    if not num_new_chars or not seq.params.stop:
        return False
    longest = max(len(s) for s in seq.params.stop)
    start = max(len(seq.text) - num_new_chars - longest + 1, 0)
    found = [(seq.text.find(s, start), s) for s in seq.params.stop]
    found = [(i, s) for i, s in found if i >= 0]
    if not found:
        return False
    index, stop = min(found)
    seq.text = seq.text[:index]
    seq.stop_reason = stop
    return True


def visible_text(seq: Sequence) -> str:
    """Text safe to show now: while running, hold back a tail that could still turn
    into a stop string, so a stop string is never shown even in part."""
    if seq.is_finished or not seq.params.stop:
        return seq.text
    hold = max(len(s) for s in seq.params.stop) - 1
    return seq.text[: max(len(seq.text) - hold, 0)]
