"""Calibration windows: chat conversations in the source's own template, mixed with documents."""
from __future__ import annotations

import torch
from tiny_lm import build_tokenizer

from latentkv.chat_data import calibration_examples, load_prompts
from latentkv.convert.api import calibration_windows
from latentkv.convert.corpus import chat_windows, default_documents, token_windows
from latentkv.convert.sources import read_source


def test_chat_windows_are_calibration_conversations_with_control_tokens():
    tok = build_tokenizer()
    tok.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                         "{% if add_generation_prompt %}<s>assistant\n{% endif %}")
    windows = chat_windows(tok, 4, 64)
    assert windows.shape == (4, 64)
    text = tok.decode(windows.flatten().tolist())
    assert "<s>user\n" in text and "<s>assistant\n" in text and "</s>" in text
    heldout = [r["prompt"] for r in load_prompts("heldout")]
    assert not any(p in text for p in heldout)                 # never the held-out split
    assert {e.id for e in calibration_examples()} == {r["id"] for r in load_prompts("calib")}
    assert torch.equal(windows, chat_windows(tok, 4, 64))      # seeded
    many = chat_windows(tok, 10**6, 64)                        # no conversation twice: runs out
    assert 0 < many.shape[0] < 10**6
    tok.chat_template = None
    assert chat_windows(tok, 4, 64).shape == (0, 64)


def test_calibration_mixes_documents_and_chat_by_share(smollm2, smollm2_tokenizer):
    ctx, tokens = 128, 8 * 128
    docs_only = calibration_windows(smollm2, None, tokens, ctx, 0.0)
    assert torch.equal(docs_only, token_windows(smollm2_tokenizer, list(default_documents(heldout=False)), ctx, tokens))
    mixed = calibration_windows(smollm2, None, tokens, ctx, 0.25)
    assert mixed.shape == (8, ctx) and torch.equal(mixed[:6], docs_only[:6])
    im_start = smollm2_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert (mixed[6:] == im_start).any() and not (mixed[:6] == im_start).any()
    assert (calibration_windows(smollm2, None, tokens, ctx, 1.0) == im_start).any(1).all()
