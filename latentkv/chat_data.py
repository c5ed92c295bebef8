"""PLACEHOLDER (helper 13b) for helper 13a's chat data module: same interface, minimal.
13a's latentkv/chat_data.py replaces this file entirely when merged."""
from __future__ import annotations

from dataclasses import dataclass

from latentkv.engine.chat_template import render_chat


@dataclass(frozen=True)
class ChatExample:
    prompt: str
    answer: str
    id: str
    category: str


def load_chat(source=None, split: str = "heldout") -> list[ChatExample]:
    raise FileNotFoundError("no chat data yet (placeholder; helper 13a's module brings it)")


def render_chat_example(tokenizer, example: ChatExample) -> tuple[list[int], int]:
    _, prompt = render_chat(tokenizer, [{"role": "user", "content": example.prompt}], add_generation_prompt=True)
    _, full = render_chat(tokenizer, [{"role": "user", "content": example.prompt},
                                      {"role": "assistant", "content": example.answer}], add_generation_prompt=False)
    if full[:len(prompt)] != prompt:
        raise ValueError(f"chat example {example.id}: the prompt's tokens are not a prefix of the conversation's")
    return full, len(prompt)
