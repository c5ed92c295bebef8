"""`convert --kv-bytes`: every candidate fits the budget by the engine's formula, the choice is the
best measured one, and the folder serves that cache with no flags."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from tiny_lm import save_tiny_llama

from latentkv.cache.accounting import latent_bytes, latent_bytes_per_token
from latentkv.config import ModelConfig
from latentkv.convert import bit_alloc, budget
from latentkv.convert.api import convert
from latentkv.convert.options import ConvertOptions
from latentkv.cache.transform_code import folder_code
from latentkv.eval.chat import evaluate_chat
from latentkv.facts import TRANSFORM_CODE
from latentkv.llm import LLM

SMOLLM2 = SimpleNamespace(num_layers=30, num_kv_heads=3, head_dim=64)


@pytest.mark.parametrize("kv_bytes", [1500, 5760, 6480, 7800, 12240, 13080, 23040, 40000])
def test_no_candidate_is_over_the_budget_and_each_takes_all_the_room_it_can(kv_bytes):
    found = budget.candidates(SMOLLM2, kv_bytes)
    assert found
    coded = [c for c in found if c.cache_dtype == budget.TRANSFORM]  # every direction; the bits decide
    assert [(c.kv_rank, c.bytes_per_token) for c in coded] == [(2 * 192 - c.rope_dim, kv_bytes) for c in coded]
    assert len(coded) == 6 * len(bit_alloc.ALLOCATIONS)  # each rope dim in each allocation, the floor among them
    assert {c.allocation for c in coded} == set(bit_alloc.ALLOCATIONS) and "uniform" in bit_alloc.ALLOCATIONS
    for c in (c for c in found if c.cache_dtype != budget.TRANSFORM):
        assert c.bytes_per_token == latent_bytes([c.kv_rank] * 30, c.rope_dim, c.cache_dtype) <= kv_bytes
        exact = 2 * 192 - c.rope_dim
        assert c.kv_rank == exact or latent_bytes([c.kv_rank + 1] * 30, c.rope_dim, c.cache_dtype) > kv_bytes
    assert {c.cache_dtype for c in found} <= set(budget.FORMATS)


def test_the_q4_0_budget_has_the_exact_conversion_in_q4_0_blocks():
    """At llama.cpp's q4_0 bytes (6,480 for SmolLM2) the exact conversion (rope 192 + rank 192) fits
    in q4_0 blocks: 216 bytes a layer, the bytes of q4_0 K and V of the original."""
    exact = [c for c in budget.candidates(SMOLLM2, 6480) if c.cache_dtype == "q4_0" and c.rope_dim == 192]
    assert [(c.kv_rank, c.bytes_per_token) for c in exact] == [(192, 6480)]


def test_a_budget_below_the_smallest_cache_is_refused_before_calibrating(tmp_path):
    with pytest.raises(ValueError, match="below the smallest cache.*90 bytes"):  # 30 layers x (1 byte + a scale)
        budget.check(SMOLLM2, 89)
    budget.check(SMOLLM2, 300)  # transform-coded: a few directions at a few bits
    with pytest.raises(ValueError, match="not both"):
        ConvertOptions(kv_bytes=6480, cache_ratio=0.5).check()
    with pytest.raises(ValueError, match="native format"):
        ConvertOptions(kv_bytes=6480, stock=True).check()


def test_a_tiny_budgeted_conversion_is_served_in_its_chosen_cache(tmp_path, few_chat_prompts, monkeypatch):
    source = save_tiny_llama(tmp_path / "llama")  # 2 layers, 2 KV heads x 16: 128 B/token in bf16
    kv_bytes = 70
    measured = []
    choose = budget.choose
    monkeypatch.setattr(budget, "choose", lambda *a, **k: measured.append(choose(*a, **k)) or measured[-1])
    served = tuple(f for f in budget.FORMATS if f != budget.TRANSFORM)
    options = ConvertOptions(kv_bytes=kv_bytes, calib_tokens=4 * 64, ctx=64, eval_tokens=0, kv_formats=served)
    out = convert(str(source), tmp_path / "mla", options)
    chosen, found = measured[0]
    cfg = ModelConfig.from_file(out / "config.json")
    assert cfg.cache_dtype == chosen.cache_dtype
    assert (cfg.qk_rope_head_dim, cfg.kv_lora_rank) == (chosen.rope_dim, chosen.kv_rank)
    assert latent_bytes_per_token(cfg, cfg.cache_dtype) <= kv_bytes
    best = max(c.agreement for c in found)
    assert len(found) > 2 and [
        c
        for c in found
        if c.agreement == best and c.rope_dim == chosen.rope_dim and c.cache_dtype == chosen.cache_dtype
    ]
    engine = LLM(str(out), dtype="float32", kv_cache_memory="1MiB").llm_engine
    assert engine.args.kv_cache_dtype == cfg.cache_dtype  # no flag: the folder's own cache
    assert engine.kv_bytes_per_token == latent_bytes_per_token(cfg, cfg.cache_dtype, "float32")
    # vLLM's name for the model dtype asks for the unquantized latent whatever the folder records
    engine = LLM(str(out), dtype="float32", kv_cache_memory="1MiB", kv_cache_dtype="float32").llm_engine
    assert engine.args.kv_cache_dtype == "auto" and not engine.runner.caches[0].quantized
    assert engine.kv_bytes_per_token == latent_bytes_per_token(cfg, "auto", "float32")
    with pytest.raises(ValueError, match="kv_cache_dtype = 'bfloat16'.*model dtype, float32"):
        LLM(str(out), dtype="float32", kv_cache_memory="1MiB", kv_cache_dtype="bfloat16")
    # eval scores it in the same cache when none is asked (as served), another when asked
    assert evaluate_chat(str(out), str(source), generate=False)["cache_dtype"] == cfg.cache_dtype
    assert evaluate_chat(str(out), str(source), generate=False, cache_dtype="fp8_e4m3")["cache_dtype"] == "fp8_e4m3"


def test_a_transform_coded_conversion_records_its_format_and_is_served_in_it(tmp_path, few_chat_prompts):
    """The folder's config holds the bits of every direction within the budget; the engine serves it
    in that format (its bytes a token), and in no other asked by name; the simulated measurement reads
    it back."""
    source = save_tiny_llama(tmp_path / "llama")  # 2 layers, 2 KV heads x 16
    options = ConvertOptions(
        kv_bytes=40, calib_tokens=4 * 64, ctx=64, eval_tokens=0, kv_formats=(budget.TRANSFORM,), kv_rope_dims=("all",)
    )
    out = convert(str(source), tmp_path / "mla", options)
    cfg = ModelConfig.from_file(out / "config.json")
    code = folder_code(cfg)
    assert cfg.cache_dtype is None and cfg.extensions["kv_bytes"] == 40
    assert 0 < code.bytes_per_token() <= 40 and (cfg.qk_rope_head_dim, cfg.kv_lora_rank) == (32, 32)
    assert [len(b) for b in code.latent_bits] == [32, 32] and any(0 < b < 8 for b in code.latent_bits[0])
    assert [len(m) for m in code.rope_mean] == [32, 32] and any(v != 0 for v in code.rope_mean[0])  # centred
    engine = LLM(str(out), dtype="float32", kv_cache_memory="1MiB").llm_engine
    assert engine.args.kv_cache_dtype == TRANSFORM_CODE and engine.kv_bytes_per_token == code.bytes_per_token()
    assert evaluate_chat(str(out), str(source), generate=False)["cache_dtype"] == TRANSFORM_CODE
    with pytest.raises(ValueError, match="this folder's cache is a transform code"):
        LLM(str(out), dtype="float32", kv_cache_memory="1MiB", kv_cache_dtype="int8")
