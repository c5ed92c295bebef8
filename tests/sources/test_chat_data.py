"""The chat prompts, the stored answers of the bundled model, rendering, and (re)generating
answers for another source (tiny models: transformers for a Llama folder, latentkv's engine for
an MLA folder)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from tiny_lm import build_tokenizer, save_tiny_llama, save_tiny_lm
from transformers import LlamaForCausalLM

from latentkv.cli import main
from latentkv.engine.chat_template import render_chat
from latentkv.sources import chat_data
from latentkv.sources.chat_data import ChatExample, load_chat, load_prompts, render_chat_example, split_of
from latentkv.sources.readers import default_gguf_path
from latentkv.user_cache import content_hash

README = Path(__file__).parents[2] / "README.md"
BUNDLED = chat_data.ASSETS / "chat_answers-smollm2-135m.jsonl"


def readme_question() -> str:
    """The user message of the README's chat example."""
    return re.search(r'"role": "user", "content": "([^"]+)"', README.read_text()).group(1)


def test_prompts_are_varied_and_split_by_id_hash():
    rows = load_prompts()
    assert 300 <= len(rows) <= 400
    assert len({r["id"] for r in rows}) == len(rows) and len({r["prompt"] for r in rows}) == len(rows)
    assert all(r["split"] == split_of(r["id"]) for r in rows)
    assert len({r["category"] for r in rows}) >= 8
    heldout = load_prompts("heldout")
    assert 0.2 < len(heldout) / len(rows) < 0.3
    assert readme_question() in {r["prompt"] for r in heldout}
    with pytest.raises(ValueError, match="split"):
        load_prompts("train")


def test_bundled_answers_belong_to_the_bundled_model():
    header, rows = chat_data.read_answers(BUNDLED)
    assert header["fingerprint"] == content_hash(default_gguf_path())
    assert header["prompts"] == chat_data.prompts_digest() and header["max_new_tokens"] == chat_data.MAX_NEW_TOKENS
    assert [r["id"] for r in rows] == [r["id"] for r in load_prompts()]
    assert chat_data.answers_file(None) == BUNDLED  # found, not regenerated
    heldout = load_chat(None, "heldout")
    calib = load_chat(None, "calib")
    assert {e.id for e in heldout} == {r["id"] for r in load_prompts("heldout")}
    assert not {e.id for e in heldout} & {e.id for e in calib}
    assert all(e.finished or len(e.answer_ids) == chat_data.MAX_NEW_TOKENS for e in heldout)
    assert len({e.answer_ids[-1] for e in heldout if e.finished}) == 1  # the end-of-turn token
    france = next(e for e in heldout if e.prompt == readme_question())
    assert "Paris" in france.answer


CHATML = (
    "{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant\n{% endif %}"
)


def test_render_puts_the_answer_after_the_templated_prompt():
    tok = build_tokenizer()
    example = ChatExample(id="x", category="fact", prompt="one two three", answer="four five")
    prompt = render_chat(tok, [{"role": "user", "content": "one two three"}])[1]
    ids, start = render_chat_example(tok, example)  # tiny_lm's template: the turn differs from the prompt
    assert ids[:start] == prompt and tok.decode(ids[start:]) == "four five"
    tok.chat_template = CHATML  # ChatML: the template's own end-of-turn follows
    ids, start = render_chat_example(tok, example)
    assert ids[:start] == render_chat(tok, [{"role": "user", "content": "one two three"}])[1]
    assert tok.decode(ids[start:]) == "four five</s>\n"
    stored = ChatExample(id="x", category="fact", prompt="one two three", answer="four five", answer_ids=(5, 6, 1))
    ids, start = render_chat_example(tok, stored)
    assert ids[start:] == [5, 6, 1]  # the source's own tokens, end-of-turn included


def test_a_new_source_gets_its_own_answers_generated_once(tmp_path, few_chat_prompts, monkeypatch):
    folder = save_tiny_llama(tmp_path / "llama")
    path = chat_data.answers_file(folder, max_new_tokens=6)
    assert path.parent == tmp_path / "cache" / "chat"
    header, rows = chat_data.read_answers(path)
    assert header["fingerprint"] == content_hash(folder) and header["generator"] == "transformers"
    # batched by prompt length, each answer is what the prompt alone gets
    model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    tok = build_tokenizer()
    for r in rows:
        ids = render_chat(tok, [{"role": "user", "content": r["prompt"]}])[1]
        alone = model.generate(torch.tensor([ids]), max_new_tokens=6, do_sample=False, eos_token_id=1, pad_token_id=1)
        want = alone[0, len(ids) :].tolist()
        assert r["answer_ids"] == (want[: want.index(1) + 1] if 1 in want else want)
        assert r["finished"] == (1 in want)
    # the second call finds the file; changed weights are another model: answered again
    calls = []
    write = chat_data.write_answers
    monkeypatch.setattr(chat_data, "write_answers", lambda *a, **k: calls.append(a) or write(*a, **k))
    assert chat_data.answers_file(folder, max_new_tokens=6) == path and not calls
    other = save_tiny_llama(tmp_path / "llama", seed=1)
    again = chat_data.answers_file(other, max_new_tokens=6)
    assert len(calls) == 1 and again != path and chat_data.read_answers(again)[0]["fingerprint"] == content_hash(other)
    assert [e.id for e in load_chat(other, "heldout", max_new_tokens=6)] == [
        r["id"] for r in few_chat_prompts if r["split"] == "heldout"
    ]


def test_an_mla_folder_answers_through_latentkv_and_the_cli_writes_the_file(tmp_path, few_chat_prompts, capsys):
    folder = tmp_path / "mla"
    save_tiny_lm(folder)
    out = tmp_path / "answers.jsonl"
    assert main(["data", "chat", str(folder), "--out", str(out), "--max-tokens", "4"]) == 0
    header, rows = chat_data.read_answers(out)
    assert header["generator"] == "latentkv" and header["fingerprint"] == content_hash(folder)
    assert len(rows) == len(few_chat_prompts) and all(0 < len(r["answer_ids"]) <= 4 for r in rows)
    assert "5 answers" in capsys.readouterr().out
    assert main(["data", "chat", str(tmp_path / "missing.gguf")]) == 2
    assert "not found" in capsys.readouterr().err
