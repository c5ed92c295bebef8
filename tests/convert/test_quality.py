"""Sanity of the lossy settings on the bundled SmolLM2 (small budget)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from latentkv.convert.calibrate import collect_stats
from latentkv.convert.layout import converted_model
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model, plan_rope
from latentkv.eval.perplexity import perplexity
from latentkv.sources.corpus import is_heldout, pydoc_documents, token_windows
from latentkv.sources.reference import source_logits

pytestmark = pytest.mark.slow  # the real SmolLM2, converted at several ranks


def split_docs():
    docs = pydoc_documents()
    return [t for n, t in docs if not is_heldout(n)], [t for n, t in docs if is_heldout(n)]


def test_perplexity_rises_as_rank_shrinks(smollm2, smollm2_tokenizer):
    calib_docs, heldout_docs = split_docs()
    calib = token_windows(smollm2_tokenizer, calib_docs, 128, 6 * 128, seed=0)
    heldout = token_windows(smollm2_tokenizer, heldout_docs, 128, 3 * 128, seed=1)
    stats = collect_stats(smollm2, calib)
    options = ConvertOptions(rope_dim=64)
    plans = plan_rope(smollm2, stats, options)
    base = perplexity(lambda ids: source_logits(smollm2, ids), heldout)["ppl"]
    ppls = []
    for rank in ["full", 160, 80, 32]:
        cfg, tensors, info = build_model(smollm2, stats, replace(options, kv_rank=rank), plans)
        ppls.append(perplexity(converted_model(cfg, tensors).full_logits, heldout)["ppl"])
    assert all(a < b for a, b in zip(ppls, ppls[1:])), ppls
    assert base < ppls[-1]


def test_int8_latent_changes_little(smollm2, smollm2_tokenizer):
    calib_docs, heldout_docs = split_docs()
    calib = token_windows(smollm2_tokenizer, calib_docs, 128, 4 * 128, seed=0)
    ids = token_windows(smollm2_tokenizer, heldout_docs, 128, 2 * 128, seed=1)
    stats = collect_stats(smollm2, calib)
    cfg, tensors, _ = build_model(smollm2, stats, ConvertOptions(rope_dim=64, kv_rank=192))
    model = converted_model(cfg, tensors)
    plain = perplexity(model.full_logits, ids)["ppl"]
    int8 = perplexity(lambda x: model.full_logits(x, cache_dtype="int8"), ids)["ppl"]
    assert int8 != plain and abs(int8 / plain - 1) < 0.03
