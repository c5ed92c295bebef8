"""`convert-sweep` with behaviour columns: the table's flags, the default rule, and a tiny run end to end."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from tiny_lm import save_tiny_llama

from latentkv.convert import sweep
from latentkv.convert.sweep import MAX_PPL_RATIO, MIN_AGREEMENT, markdown_table, pick_default, ranks_at, run_sweep

BASE = {"docs": 10.0, "prose": 20.0, "code": 5.0}


def row(rank, ratio, agreement, degenerate, worst=1.0, fmt="native"):
    return {
        "rope_dim": 64,
        "format": fmt,
        "kv_rank": rank,
        "cache_ratio": ratio,
        "bytes_bf16": int(ratio * 1000),
        "top1_agreement": agreement,
        "kl": 0.1,
        "match_mean": 9.0,
        "degenerate": degenerate,
        "examples": 86,
        "ppl_docs": 10.0 * worst,
        "ppl_prose": 20.0,
        "ppl_code": 5.0,
        "ppl_ratio_max": worst,
    }


def test_the_default_is_the_smallest_native_cache_meeting_both_bars():
    rows = [
        row(320, 1.0, 0.999, 0),
        row(256, 0.833, 0.96, 0),
        row(224, 0.75, MIN_AGREEMENT, 0),
        row(192, 0.667, 0.97, 0, worst=MAX_PPL_RATIO + 0.01),
        row(128, 0.5, 0.85, 2),
        row(96, 0.4, 0.99, 0, fmt="stock"),
    ]
    assert pick_default(rows)["kv_rank"] == 224
    assert pick_default([r for r in rows if r["top1_agreement"] < 0.95]) is None
    table = markdown_table(rows, BASE, 1000)
    lines = table.splitlines()
    assert "chat top-1" in lines[0] and "ppl prose ×" in lines[0]
    assert "**2 of 86: degenerate repetition**" in lines[6]  # <= half the cache and degenerate: flagged
    assert "degenerate repetition" not in "\n".join(lines[:6])
    assert lines[4].endswith("| yes |") and lines[5].endswith("| no |")


def test_a_tiny_sweep_measures_behaviour_and_perplexity_per_domain(tmp_path, few_chat_prompts):
    source = save_tiny_llama(tmp_path / "llama")
    out = tmp_path / "sweep"
    result = run_sweep(
        str(source),
        out,
        rope_dims=(8,),
        formats=("native",),
        ranks=["full", 4],
        calib_tokens=4 * 64,
        eval_tokens=2 * 64,
        ctx=64,
        int8_formats=("native",),
        log=lambda msg: None,
    )
    assert {p.name for p in out.iterdir()} >= {"sweep.md", "sweep.json", "sweep.png"}
    assert json.loads((out / "sweep.json").read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    full, small = result["rows"]
    heldout = sum(r["split"] == "heldout" for r in few_chat_prompts)
    for r in (full, small):
        assert r["examples"] == heldout and 0 <= r["top1_agreement"] <= 1 and r["degenerate"] <= heldout
        assert set(r) >= {"ppl_docs", "ppl_prose", "ppl_code", "ppl_int8", "kl", "match_mean"}
        assert len(r["answers"]) == heldout and all(isinstance(a, str) for a in r["answers"].values())
    assert full["kl"] < small["kl"]  # a latent of rank 4 loses more than the full one
    assert result["calib_chat"] == 0.5 and result["chat_examples"] == heldout and result["calib_weight"] == 1.0


def test_sizes_give_each_rope_dim_the_rank_that_makes_the_cache():
    smol = SimpleNamespace(kv_elements=lambda: 384)  # 3 KV heads x 64: 384 elements per token per layer
    assert ranks_at(smol, 64, [1.0, 0.833, 0.5]) == ["full", 256, 128]
    assert ranks_at(smol, 192, [1.0, 0.833, 0.5]) == ["full", 128]  # rope all at half the cache: no room, left out


def sweep_run(folder, rows, **changes):
    meta = {
        "source": "model.gguf",
        "source_ppl": BASE,
        "source_bytes_bf16": 1000,
        "ctx": 64,
        "eval_tokens": {"docs": 63},
        "chat_examples": 86,
        "calib_tokens": 256,
        "calib_chat": 0.5,
        "protocol": "windows",
        **changes,
    }
    folder.mkdir()
    sweep.write_outputs(folder, meta, rows)
    return folder


def test_merged_runs_make_one_table_and_pick_the_default_over_all_rows(tmp_path):
    a = sweep_run(tmp_path / "a", [row(128, 0.5, 0.80, 3), row(256, 0.833, 0.93, 0)])
    b = sweep_run(tmp_path / "b", [row(288, 0.917, 0.955, 0), row(320, 1.0, 0.97, 0)])
    assert json.loads((a / "sweep.json").read_text())["default"] is None
    result = sweep.merge_sweeps([a, b], tmp_path / "merged")
    assert [r["kv_rank"] for r in result["rows"]] == [320, 288, 256, 128]  # largest cache first
    assert result["default"]["kv_rank"] == 288 and result["merged_from"] == [str(a), str(b)]
    assert json.loads((tmp_path / "merged" / "sweep.json").read_text()) == json.loads(json.dumps(result))
    assert len((tmp_path / "merged" / "sweep.md").read_text().splitlines()) == 2 + 4


def test_runs_with_another_protocol_are_not_merged(tmp_path):
    a = sweep_run(tmp_path / "a", [row(128, 0.5, 0.80, 3)])
    b = sweep_run(tmp_path / "b", [row(256, 0.833, 0.93, 0)], calib_chat=1.0)
    with pytest.raises(ValueError, match="calib_chat"):
        sweep.merge_sweeps([a, b], tmp_path / "merged")
    assert not (tmp_path / "merged").exists()


def test_runs_with_other_calibration_weights_are_not_merged(tmp_path):
    """A run from before --calib-weight (no field) measured with weight 1: it merges with 1, not with 4."""
    old = sweep_run(tmp_path / "old", [row(128, 0.5, 0.80, 3)])
    same = sweep_run(tmp_path / "same", [row(256, 0.833, 0.93, 0)], calib_weight=1.0)
    weighted = sweep_run(tmp_path / "weighted", [row(288, 0.917, 0.95, 0)], calib_weight=4.0)
    assert sweep.merge_sweeps([old, same], tmp_path / "merged")["calib_weight"] == 1.0
    with pytest.raises(ValueError, match="calib_weight"):
        sweep.merge_sweeps([old, weighted], tmp_path / "merged2")


def test_runs_with_other_rope_phases_are_not_merged(tmp_path):
    """A run from before the phase window (no fields) converted with φ over every distance and
    k-weight 5: it merges with that, not with the default window and k-weight."""
    old = sweep_run(tmp_path / "old", [row(128, 0.5, 0.80, 3)])
    same = sweep_run(tmp_path / "same", [row(256, 0.833, 0.93, 0)], rope_window=None, k_weight=5.0)
    windowed = sweep_run(tmp_path / "windowed", [row(288, 0.917, 0.95, 0)], rope_window=64, k_weight=5.0)
    reweighted = sweep_run(tmp_path / "reweighted", [row(288, 0.917, 0.95, 0)], rope_window=None, k_weight=2.0)
    assert sweep.merge_sweeps([old, same], tmp_path / "merged")["rope_window"] is None
    with pytest.raises(ValueError, match="rope_window"):
        sweep.merge_sweeps([old, windowed], tmp_path / "merged2")
    with pytest.raises(ValueError, match="k_weight"):
        sweep.merge_sweeps([old, reweighted], tmp_path / "merged3")
