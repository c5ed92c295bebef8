"""`eval chat` on tiny random models: the identical model agrees everywhere, a perturbed one less;
the teacher-forced match length equals what greedy generation shares with the answer; the CLI
prints the table and writes the JSON."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from tiny_lm import build_model, build_tokenizer

from latentkv import cli
from latentkv.eval import chat as chat_eval
from latentkv.eval.chat import ChatCase, ChatModel, chat_metrics
from latentkv.engine.chat_template import render_chat

PROMPTS = ["one two three", "the quick brown fox", "héllo wörld", "def main(): return", "four five six seven"]
ANSWER_TOKENS = 12


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(reference folder, perturbed copy folder): tiny DeepSeek models with a chat template."""
    root = tmp_path_factory.mktemp("chat")
    tok = build_tokenizer()
    model = build_model("v2_dense")
    model.save_pretrained(root / "ref")
    tok.save_pretrained(root / "ref")
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".self_attn." in name:
                p.add_(torch.randn_like(p) * 0.05 * p.std())
    model.save_pretrained(root / "perturbed")
    tok.save_pretrained(root / "perturbed")
    return root / "ref", root / "perturbed"


@pytest.fixture(scope="module")
def cases(folders):
    """Rendered prompts answered by the reference model's own greedy tokens (kept as ids: text
    would not always re-tokenize to the same ids)."""
    ref = ChatModel.load(str(folders[0]))
    prompts = [render_chat(ref.tokenizer, [{"role": "user", "content": p}])[1] for p in PROMPTS]
    answers = ref.greedy(prompts, [ANSWER_TOKENS] * len(prompts))
    return [
        ChatCase(f"ex{i}", "a" if i % 2 else "b", tuple(p + a), len(p))
        for i, (p, a) in enumerate(zip(prompts, answers))
    ]


def test_identical_model_agrees_everywhere(folders, cases):
    ref = ChatModel.load(str(folders[0]))
    r = chat_metrics(ChatModel.load(str(folders[0])), ref, cases)
    assert r["examples"] == len(PROMPTS) and r["positions"] == sum(len(c.answer) for c in cases)
    assert r["top1_agreement"] == 1.0 and r["kl"] == pytest.approx(0.0, abs=1e-6)
    assert r["match_mean"] == pytest.approx(sum(len(c.answer) for c in cases) / len(cases)) and r["full_match"] == 1.0
    assert set(r["by_category"]) == {"a", "b"} and r["degenerate"] == r["degenerate_reference"]


def test_perturbed_model_agrees_less_and_match_length_is_the_greedy_prefix(folders, cases):
    ref = ChatModel.load(str(folders[0]))
    other = ChatModel.load(str(folders[1]))
    r = chat_metrics(other, ref, cases)
    assert r["top1_agreement"] < 1.0 and r["kl"] > 1e-3 and r["full_match"] < 1.0
    # the teacher-forced count equals decoding greedily from the prompt and comparing
    for case, p in zip(cases, r["per_example"]):
        generated = other.greedy([list(case.ids[: case.answer_start])], [len(case.answer)])[0]
        shared = next(
            (i for i, (a, b) in enumerate(zip(generated, case.answer)) if a != b), min(len(generated), len(case.answer))
        )
        assert p["match"] == shared, (case.id, generated, case.answer)
        assert p["greedy_tokens"] >= min(len(generated), p["match"] + 1)
    # the agreement counts what the definition says, on one case by hand
    case, p = cases[0], r["per_example"][0]
    ids = torch.tensor([case.ids])
    rows = slice(case.answer_start - 1, len(case.ids) - 1)
    by_hand = (other.logits(ids)[0, rows].argmax(-1) == ref.logits(ids)[0, rows].argmax(-1)).sum().item()
    assert p["agree"] == by_hand


def test_cases_must_have_an_answer():
    with pytest.raises(ValueError, match="no chat examples"):
        chat_metrics(None, None, [])
    assert ChatCase("x", "c", (1, 2, 3), 1).answer == [2, 3]


def test_cli_prints_the_table_and_writes_json(folders, cases, tmp_path, capsys, monkeypatch):
    by_id = {c.id: c for c in cases}
    examples = [SimpleNamespace(prompt="", answer="", id=c.id, category=c.category) for c in cases]
    monkeypatch.setattr(chat_eval, "load_chat", lambda source, split: examples if split == "heldout" else [])
    monkeypatch.setattr(
        chat_eval, "render_chat_example", lambda tok, ex: (list(by_id[ex.id].ids), by_id[ex.id].answer_start)
    )
    out = tmp_path / "chat.json"
    assert cli.main(["eval", "chat", str(folders[1]), "--reference", str(folders[0]), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "top-1 agreement" in text and "| **all** |" in text and "degenerate rule" in text
    r = json.loads(out.read_text())
    assert r["examples"] == len(PROMPTS) and 0.0 <= r["top1_agreement"] < 1.0
    assert all("greedy_text" in p for p in r["per_example"])
    assert cli.main(["eval", "chat", str(tmp_path / "missing"), "--reference", str(folders[0])]) == 2
    assert "latentkv eval chat: error" in capsys.readouterr().err
