"""Conversations to prompts through the tokenizer's chat template (for `LLM.chat`, the
server's /v1/chat/completions and `latentkv chat` / `generate --chat` alike)."""
from __future__ import annotations


def render_chat(tokenizer, conversation: list[dict], add_generation_prompt: bool = True,
                chat_template: str | None = None) -> tuple[str, list[int]]:
    """The templated prompt text and its token ids. The template writes any BOS itself, so
    no special tokens are added a second time."""
    if tokenizer is None:
        raise ValueError("chat needs a tokenizer (skip_tokenizer_init=True was given)")
    if chat_template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template; send a plain prompt (e.g. /v1/completions)")
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         chat_template=chat_template)
    return text, tokenizer(text, add_special_tokens=False).input_ids
