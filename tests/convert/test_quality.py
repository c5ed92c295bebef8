"""Sanity of the lossy settings on the bundled SmolLM2 (small budget)."""
from __future__ import annotations

import torch

from latentkv.convert.calibrate import collect_stats
from latentkv.convert.corpus import is_heldout, pydoc_documents, token_windows
from latentkv.convert.mla_reference import mla_logits
from latentkv.convert.pipeline import Settings, build_model, plan_rope
from latentkv.convert.reference import source_logits
from latentkv.eval.ppl import perplexity


def split_docs():
    docs = pydoc_documents()
    return [t for n, t in docs if not is_heldout(n)], [t for n, t in docs if is_heldout(n)]


def test_perplexity_rises_as_rank_shrinks(smollm2, smollm2_tokenizer):
    calib_docs, heldout_docs = split_docs()
    calib = token_windows(smollm2_tokenizer, calib_docs, 128, 6 * 128, seed=0)
    heldout = token_windows(smollm2_tokenizer, heldout_docs, 128, 3 * 128, seed=1)
    stats = collect_stats(smollm2, calib)
    settings = Settings(rope_dim=64)
    plans = plan_rope(smollm2, stats, settings)
    base = perplexity(lambda ids: source_logits(smollm2, ids), heldout)["ppl"]
    ppls = []
    for rank in ["full", 160, 80, 32]:
        settings.kv_rank = rank
        cfg, tensors, info = build_model(smollm2, stats, settings, plans)
        ppls.append(perplexity(lambda ids: mla_logits(cfg, tensors, ids), heldout)["ppl"])
    assert all(a < b for a, b in zip(ppls, ppls[1:])), ppls
    assert base < ppls[-1]


def test_int8_latent_changes_little(smollm2, smollm2_tokenizer):
    calib_docs, heldout_docs = split_docs()
    calib = token_windows(smollm2_tokenizer, calib_docs, 128, 4 * 128, seed=0)
    ids = token_windows(smollm2_tokenizer, heldout_docs, 128, 2 * 128, seed=1)
    stats = collect_stats(smollm2, calib)
    cfg, tensors, _ = build_model(smollm2, stats, Settings(rope_dim=64, kv_rank=192))
    plain = perplexity(lambda x: mla_logits(cfg, tensors, x), ids)["ppl"]
    int8 = perplexity(lambda x: mla_logits(cfg, tensors, x, int8=True), ids)["ppl"]
    assert int8 != plain and abs(int8 / plain - 1) < 0.03
