"""Chat template rendering in which message content is only ever text.

The template's own markers (`<|im_start|>`, `<s>`, ...) become their special tokens;
the same strings inside a message's content are tokenized as plain text, so a user
cannot forge a system turn by typing the markers.

How: the template is rendered once with a unique placeholder per message; the text
between placeholders is the template's. Special tokens are split out of those parts
only; every run of text between two special tokens — template text and content
together, exactly as a plain tokenization would see it — is tokenized with special
tokens not parsed. With content free of markers this gives the usual token ids.
"""
from __future__ import annotations

import re
import uuid

from latentkv.server.errors import PromptError


def special_tokens(tokenizer) -> list[str]:
    """The added tokens marked special (the ones a tokenizer would parse out of text)."""
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    tokens = {t.content for t in decoder.values() if getattr(t, "special", False)}
    tokens |= set(getattr(tokenizer, "all_special_tokens", []) or [])
    return sorted((t for t in tokens if t), key=len, reverse=True)


def render_chat(tokenizer, conversation: list[dict], add_generation_prompt: bool = True) -> tuple[str, list[int]]:
    """The templated prompt text and its token ids (the template writes any BOS itself)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise PromptError("this model has no chat template; use /v1/completions")
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt)
    specials = special_tokens(tokenizer)
    if not any(s in m["content"] for m in conversation for s in specials):
        return text, tokenizer(text, add_special_tokens=False).input_ids   # nothing to escape
    pieces = template_pieces(tokenizer, conversation, add_generation_prompt)
    return text, tokenize_pieces(tokenizer, pieces, specials)


def template_pieces(tokenizer, conversation: list[dict], add_generation_prompt: bool) -> list[tuple[str, bool]]:
    """[(text, is_template)] in order: the template's text and each message's content."""
    marks = [f"\ue000{uuid.uuid4().hex}{i}\ue001" for i in range(len(conversation))]
    marked = [{**m, "content": mark} for m, mark in zip(conversation, marks)]
    skeleton = tokenizer.apply_chat_template(marked, tokenize=False, add_generation_prompt=add_generation_prompt)
    pieces: list[tuple[str, bool]] = []
    rest = skeleton
    for message, mark in zip(conversation, marks):
        before, found, rest = rest.partition(mark)
        if not found or mark in rest:
            # the template transforms or repeats content: we cannot tell content from markers
            raise PromptError("a message contains one of the model's control tokens, and this chat template "
                              "does not let them be passed as text", code="invalid_prompt")
        pieces += [(before, True), (message["content"], False)]
    pieces.append((rest, True))
    return pieces


def tokenize_pieces(tokenizer, pieces: list[tuple[str, bool]], specials: list[str]) -> list[int]:
    """Special tokens only from template pieces; each text run between them tokenized whole, as text."""
    split = re.compile("(" + "|".join(re.escape(s) for s in specials) + ")")
    ids: list[int] = []
    run = ""
    for text, is_template in pieces:
        parts = split.split(text) if is_template else [text]
        for j, part in enumerate(parts):
            if j % 2 == 1:   # a marker of the template itself
                ids += tokenize_text(tokenizer, run)
                ids.append(tokenizer.convert_tokens_to_ids(part))
                run = ""
            else:
                run += part
    return ids + tokenize_text(tokenizer, run)


def tokenize_text(tokenizer, text: str) -> list[int]:
    if not text:
        return []
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids
