"""`bench frontier`: a quick run on a tiny model end to end, and a llama.cpp row that crashes is
recorded while the bench goes on."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from tiny_lm import save_tiny_llama

from latentkv.bench import frontier, kivi
from latentkv.cache.accounting import latent_bytes_per_token
from latentkv.config import ModelConfig
from latentkv.cache.transform_code import folder_code
from latentkv.sources.readers import read_source
from latentkv.sources.reference import source_logits


def test_a_quick_frontier_converts_each_budget_and_measures_every_row(tmp_path, few_chat_prompts):
    source = save_tiny_llama(tmp_path / "llama")
    out = tmp_path / "frontier"
    result = frontier.run_frontier(
        str(source), out, budgets=[70, 50], quick=True, dtypes=("float32",), log=lambda m: None
    )
    assert {p.name for p in out.iterdir()} >= {"frontier.json", "frontier.md", "frontier.png", "kv70", "kv50"}
    assert json.loads((out / "frontier.json").read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    rows = {r["command"]: r for r in result["rows"]}
    for budget in (70, 50):
        row = rows[f"latentkv convert --kv-bytes {budget} --out kv{budget}"]
        cfg = ModelConfig.from_file(out / f"kv{budget}" / "config.json")
        code = folder_code(cfg)  # a transform-coded folder: its format's bytes (measured simulated)
        served = code.bytes_per_token() if code else latent_bytes_per_token(cfg, cfg.cache_dtype)
        assert row["bytes_per_token"] == served <= budget
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
    assert frontier.folder_arg("runs/m:int8_rope8") == (
        frontier.Path("runs/m"),
        "int8_rope8",
        "latentkv eval chat runs/m --cache-dtype int8_rope8",
    )
    assert frontier.folder_arg("runs/a:b") == (frontier.Path("runs/a:b"), None, "latentkv eval chat runs/a:b")


def test_the_originals_cache_is_measured_in_each_llama_cpp_kv_type_in_the_reference_forward(tmp_path, few_chat_prompts):
    source = save_tiny_llama(
        tmp_path / "llama", num_attention_heads=2, num_key_value_heads=2
    )  # head_dim 32: one ggml block
    result = frontier.run_frontier(
        str(source), tmp_path / "f", quick=True, dtypes=("float32",), systems=("reference",), log=lambda m: None
    )
    rows = {r["system"]: r for r in result["rows"]}
    assert set(rows) == {f"original, {kind} KV (float32 forward, cache round trip)" for kind in frontier.LLAMA_KV}
    for kind, (_, per_value) in frontier.LLAMA_KV.items():
        row = rows[f"original, {kind} KV (float32 forward, cache round trip)"]
        assert row["bytes_per_token"] == round(2 * 2 * 2 * 32 * per_value) and 0 <= row["agreement_float32"] <= 1
    kivi_rows = frontier.run_frontier(
        str(source), tmp_path / "k", quick=True, dtypes=("float32",), systems=("kivi",), log=lambda m: None
    )["rows"]
    assert [r["bytes_per_token"] for r in kivi_rows] == sorted(
        (kivi.bytes_per_token(2, 2, 32, *v) for v in kivi.VARIANTS), reverse=True
    )
    assert all(r["ppl_docs"] != result["original_ppl"]["docs"] for r in kivi_rows)
    # the 4-bit cache moved the perplexity away from the original's (the round trip was applied)
    q4 = rows["original, q4_0 KV (float32 forward, cache round trip)"]
    assert all(q4[f"ppl_{d}"] != result["original_ppl"][d] for d in ("docs", "prose", "code"))


def test_ggml_round_trip_is_llama_cpps_block_quantization():
    torch.manual_seed(0)
    x = torch.randn(3, 4, 64) * torch.rand(3, 4, 1) * 10
    assert torch.equal(frontier.ggml_round_trip(x, "f16"), x.half().float())
    blocks = x.view(3, 4, 2, 32)
    for kind, levels, lo, hi, rounding in (("q8_0", 127, -127, 127, 0.5), ("q4_0", 8, -8, 7, 1.0)):
        y = frontier.ggml_round_trip(x, kind).view(3, 4, 2, 32)
        top = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))  # the value of largest magnitude
        step = top.abs() / 127 if kind == "q8_0" else -top / 8  # the block's scale (q4_0's signed), stored as float16
        stored = step.half().float()
        codes = y / stored
        assert torch.allclose(codes, codes.round(), atol=1e-4)  # every value on the block's grid
        assert codes.round().min() >= lo and codes.round().max() <= hi
        # half a step from rounding (a whole one where q4_0 clamps +8 to +7), plus the float16 scale's error
        assert ((y - blocks).abs() <= rounding * step.abs() + levels * (step - stored).abs() + 1e-6).all()
    # q4_0: the value of largest magnitude is kept (as -8 steps of d = -max/8), up to its float16 scale
    y = frontier.ggml_round_trip(x, "q4_0").view(3, 4, 2, 32)
    top = blocks.abs().argmax(-1, keepdim=True)
    assert torch.allclose(y.gather(-1, top), blocks.gather(-1, top), rtol=1e-3)


def test_the_reference_forward_with_a_kv_store_changes_only_through_it(tmp_path):
    src = read_source(str(save_tiny_llama(tmp_path / "llama")))
    ids = torch.randint(0, 100, (1, 12))
    assert torch.equal(source_logits(src, ids, lambda x: x), source_logits(src, ids))
    assert not torch.allclose(source_logits(src, ids, lambda x: x.round()), source_logits(src, ids))
