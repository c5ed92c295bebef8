"""Healing on the chat mix: the calib split's conversations are in the training windows, the
held-out split's never; eval chat runs before, during and after."""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from latentkv.heal import HealConfig, behaviour, heal
from latentkv.heal import windows as heal_windows
from latentkv.sources.chat_data import ChatExample, load_chat, render_chat_example, split_of

WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
CALIB = [
    ChatExample(id=f"calib-{i}", category="list", prompt=f"count from {w}", answer=f"{w} {WORDS[(i + 1) % 8]} the fox.")
    for i, w in enumerate(WORDS)
]
# held out: the same kind of conversation with words calibration never saw (healing is expected to
# carry over to them, as to the real held-out prompts), plus non-ASCII text for the tokenizer paths
HELDOUT = [
    ChatExample(id=f"held-{i}", category="list", prompt=f"count from {w} 😀", answer=f"{w} {WORDS[i]} the fox, café.")
    for i, w in enumerate(["nine", "ten", "naïve"])
]


@pytest.fixture
def fake_chat(monkeypatch):
    """The chat data of the tiny teacher; records which splits were asked for."""
    calls = []

    def load_chat(source, split):
        calls.append(split)
        return {"calib": CALIB, "heldout": HELDOUT}[split]

    monkeypatch.setattr(heal_windows, "load_chat", load_chat)
    monkeypatch.setattr(behaviour, "load_chat", load_chat)
    return calls


def contains(stream: list[int], part: list[int]) -> bool:
    return any(stream[i : i + len(part)] == part for i in range(len(stream) - len(part) + 1))


def test_chat_mix_has_calib_conversations_and_never_heldout(tiny_pair, fake_chat):
    teacher, native, _, text = tiny_pair
    tok = AutoTokenizer.from_pretrained(native)
    windows = heal_windows.training_windows(
        tok, [str(text)], 32, 32 * 40, 0, heal_windows.calib_chat(str(teacher)), 0.5
    )
    assert fake_chat == ["calib"] and windows.shape == (40, 32)
    stream = windows[:20].flatten().tolist()  # the chat half: packed conversations, back to back
    calib = [render_chat_example(tok, ex)[0] for ex in CALIB]
    assert sum(contains(stream, c) for c in calib) >= len(CALIB) - 1  # each whole (one may be cut at the end)
    for ex in HELDOUT:
        ids, start = render_chat_example(tok, ex)
        assert not contains(windows.flatten().tolist(), ids[start - 4 :])
    docs_only = heal_windows.training_windows(tok, [str(text)], 32, 32 * 40, 0)
    assert docs_only.shape == (40, 32) and not any(contains(docs_only.flatten().tolist(), c) for c in calib)


def test_heal_reports_eval_chat_before_during_after(heal_settings, fake_chat, tmp_path):
    # the chat mix at its default share, eval chat on 2 held-out prompts every 5 steps
    cfg = heal_settings(
        tmp_path / "healed", steps=10, lr=1e-2, chat_share=HealConfig.chat_share, eval_examples=2, eval_every=5
    )
    result = heal(cfg)
    assert set(fake_chat) == {"calib", "heldout"}
    assert result.chat_before["examples"] == 2 and result.chat_after["examples"] == 2
    assert [c["step"] for c in result.chat_curve] == [0, 5, 10]
    assert result.chat_after["kl"] < result.chat_before["kl"], (result.chat_before["kl"], result.chat_after["kl"])
    assert result.chat_before["degenerate"] is not None and "top-1 agreement" in result.chat_table
    saved = json.loads((tmp_path / "healed" / "chat_eval.json").read_text())
    assert saved["after"]["top1_agreement"] == result.chat_after["top1_agreement"]
    assert (tmp_path / "healed" / "chat_agreement.png").exists()


def test_default_chat_mix_is_the_calib_split_of_the_bundled_data():
    """The bundled model's chat mix: calib prompts only, none of the held-out ones (by id or text)."""
    calib, heldout = heal_windows.calib_chat(None), load_chat(None, "heldout")
    assert calib and heldout
    assert not {e.id for e in calib} & {e.id for e in heldout}
    assert not {e.prompt for e in calib} & {e.prompt for e in heldout}
    assert all(split_of(e.id) == "calib" for e in calib)
