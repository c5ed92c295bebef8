"""Conversations to prompts through the tokenizer's chat template (for `LLM.chat`, the
server's /v1/chat/completions and `latentkv chat` / `generate --chat` alike).

Message content is only ever text: the template's own markers (`<|im_start|>`, `<s>`, ...)
become their special tokens, but the same strings inside a message are tokenized as plain
text, so a user cannot forge a system turn by typing them. How: the template is rendered
once more with a unique placeholder per message, so the text between placeholders is the
template's. Special tokens are split out of those parts only; each run of text between
two special tokens — template text and content together, as a plain tokenization would
see it — is tokenized with special tokens not parsed. Content free of markers takes the
usual path (identical ids).
"""

from __future__ import annotations

import re
import uuid

from latentkv.engine.prompt_errors import PromptError


def render_chat(
    tokenizer,
    conversation: list[dict],
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    tools: list[dict] | None = None,
) -> tuple[str, list[int]]:
    """The templated prompt text and its token ids. The template writes any BOS itself, so
    no special tokens are added a second time. `tools` (OpenAI tool definitions) reach
    templates that define a tool format; others ignore them."""
    if tokenizer is None:
        raise PromptError("chat needs a tokenizer (skip_tokenizer_init=True was given)")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise PromptError("this model has no chat template; send a plain prompt (e.g. /v1/completions)")

    def apply(messages: list[dict]) -> str:
        return tokenizer.apply_chat_template(
            messages,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            chat_template=chat_template,
            tools=tools,
        )

    text = apply(conversation)
    specials = special_tokens(tokenizer)
    if not any(s in str(m.get("content") or "") for m in conversation for s in specials):
        return text, tokenizer(text, add_special_tokens=False).input_ids  # nothing to escape
    return text, tokenize_pieces(tokenizer, template_pieces(apply, conversation), specials)


def special_tokens(tokenizer) -> list[str]:
    """The added tokens marked special (the ones a tokenizer parses out of text), longest first."""
    decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    tokens = {t.content for t in decoder.values() if getattr(t, "special", False)}
    tokens |= set(getattr(tokenizer, "all_special_tokens", []) or [])
    return sorted((t for t in tokens if t), key=len, reverse=True)


def template_pieces(apply, conversation: list[dict]) -> list[tuple[str, bool]]:
    """[(text, is_template)] in order: the template's text and each message's content."""
    marks = [f"\ue000{uuid.uuid4().hex}{i}\ue001" for i in range(len(conversation))]
    skeleton = apply([{**m, "content": mark} for m, mark in zip(conversation, marks)])
    pieces: list[tuple[str, bool]] = []
    rest = skeleton
    for message, mark in zip(conversation, marks):
        before, found, rest = rest.partition(mark)
        if not found or mark in rest:
            # the template transforms or repeats content: content and markers cannot be told apart
            raise PromptError(
                "a message contains one of the model's control tokens, and this chat template "
                "does not let them be passed as text"
            )
        pieces += [(before, True), (str(message.get("content") or ""), False)]
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
            if j % 2:  # a marker of the template itself
                ids += tokenize_text(tokenizer, run) + [tokenizer.convert_tokens_to_ids(part)]
                run = ""
            else:
                run += part
    return ids + tokenize_text(tokenizer, run)


def tokenize_text(tokenizer, text: str) -> list[int]:
    if not text:
        return []
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids
