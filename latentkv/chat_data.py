"""PLACEHOLDER (helper 13b) for helper 13a's chat data module: the same interface, minimal.
13a's latentkv/chat_data.py replaces this file entirely when merged."""
from __future__ import annotations

from dataclasses import dataclass

from latentkv.engine.chat_template import render_chat


@dataclass(frozen=True)
class ChatExample:
    id: str
    category: str
    prompt: str
    answer: str
    answer_ids: tuple[int, ...] = ()
    finished: bool = True


def load_chat(source=None, split: str = "heldout") -> list[ChatExample]:
    raise FileNotFoundError("no chat data yet (placeholder; helper 13a's module brings it)")


def render_chat_example(tokenizer, example: ChatExample) -> tuple[list[int], int]:
    _, prompt_ids = render_chat(tokenizer, [{"role": "user", "content": example.prompt}])
    answer = list(example.answer_ids) or tokenizer(example.answer, add_special_tokens=False).input_ids
    return prompt_ids + answer, len(prompt_ids)
