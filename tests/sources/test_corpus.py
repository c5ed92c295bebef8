"""Chat windows for calibration: the calib split's conversations in the source's own template, control
tokens included, never the held-out split."""

from __future__ import annotations

import torch
from tiny_lm import build_tokenizer

from latentkv.sources.chat_data import calibration_examples, load_prompts
from latentkv.sources.corpus import chat_windows


def test_chat_windows_are_calibration_conversations_with_control_tokens():
    tok = build_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
        "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
    )
    windows = chat_windows(tok, 4, 64)
    assert windows.shape == (4, 64)
    text = tok.decode(windows.flatten().tolist())
    assert "<s>user\n" in text and "<s>assistant\n" in text and "</s>" in text
    heldout = [r["prompt"] for r in load_prompts("heldout")]
    assert not any(p in text for p in heldout)  # never the held-out split
    assert {e.id for e in calibration_examples()} == {r["id"] for r in load_prompts("calib")}
    assert torch.equal(windows, chat_windows(tok, 4, 64))  # seeded
    many = chat_windows(tok, 10**6, 64)  # no conversation twice: runs out
    assert 0 < many.shape[0] < 10**6
    tok.chat_template = None
    assert chat_windows(tok, 4, 64).shape == (0, 64)
