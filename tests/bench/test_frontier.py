"""`bench frontier`: a quick run on a tiny model end to end, and a llama.cpp row that crashes is
recorded while the bench goes on."""
from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from tiny_lm import save_tiny_llama

from latentkv.bench import frontier
from latentkv.cache.accounting import latent_bytes_per_token
from latentkv.config import ModelConfig


def test_a_quick_frontier_converts_each_budget_and_measures_every_row(tmp_path, few_chat_prompts):
    source = save_tiny_llama(tmp_path / "llama")
    out = tmp_path / "frontier"
    result = frontier.run_frontier(str(source), out, budgets=[70, 50], quick=True, dtypes=("float32",), log=lambda m: None)
    assert {p.name for p in out.iterdir()} >= {"frontier.json", "frontier.md", "frontier.png", "kv70", "kv50"}
    assert json.loads((out / "frontier.json").read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    rows = {r["command"]: r for r in result["rows"]}
    for budget in (70, 50):
        row = rows[f"latentkv convert --kv-bytes {budget} --out kv{budget}"]
        cfg = ModelConfig.from_file(out / f"kv{budget}" / "config.json")
        assert row["bytes_per_token"] == latent_bytes_per_token(cfg, cfg.cache_dtype) <= budget
        assert 0 <= row["agreement_float32"] <= 1 and all(row[f"ppl_{d}"] > 1 for d in ("docs", "prose", "code"))
    assert "| latentkv kv70" in (out / "frontier.md").read_text()


def test_a_llama_cpp_row_that_crashes_is_recorded_and_the_others_go_on(monkeypatch):
    monkeypatch.setattr(frontier, "LLAMA_SCORER", "fake_baseline:SegfaultOnScore")
    monkeypatch.setattr(frontier, "llama_cpp_available", lambda: True)
    judge = object.__new__(frontier.Judge)
    judge.src = SimpleNamespace(num_layers=2, num_kv_heads=1, head_dim=4)
    judge.cases = [SimpleNamespace(ids=(1, 2, 3), answer_start=2)]
    judge.ref_top, judge.windows = [torch.tensor([5])], {}
    failed = {}
    assert frontier.llama_rows(judge, "model.gguf", failed, ctx=8) == []
    assert set(failed) == {f"llama.cpp original, {kind} KV" for kind in frontier.LLAMA_KV}
    assert all("signal 11" in reason for reason in failed.values())


def test_a_folder_is_measured_in_the_cache_dtype_given_or_its_own():
    assert frontier.folder_arg("runs/m:int8_rope8") == (frontier.Path("runs/m"), "int8_rope8",
                                                        "latentkv eval chat runs/m --cache-dtype int8_rope8")
    assert frontier.folder_arg("runs/a:b") == (frontier.Path("runs/a:b"), None, "latentkv eval chat runs/a:b")
