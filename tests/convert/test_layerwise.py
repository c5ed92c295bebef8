"""The perplexity check run one layer at a time gives the whole models' numbers."""

from __future__ import annotations

import pytest
import torch

from latentkv.convert.calibrate import collect_stats
from latentkv.convert.export import export
from latentkv.convert.layerwise import converted_perplexity, source_perplexity
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import convert_parts
from latentkv.eval.perplexity import perplexity
from latentkv.model.loader import load_model
from latentkv.sources.readers import read_source
from latentkv.sources.reference import source_logits

from random_llama import SHAPES, write_random_llama

VOCAB = 128


def test_layerwise_perplexity_equals_the_whole_models(tmp_path):
    folder = write_random_llama(tmp_path / "rand", vocab_size=VOCAB, tokenizer=False, **SHAPES["small"])
    src = read_source(folder, resident_limit=0)  # streamed: every tensor read from the file when used
    gen = torch.Generator().manual_seed(0)
    calib = torch.randint(0, VOCAB, (4, 32), generator=gen)
    windows = torch.randint(0, VOCAB, (3, 32), generator=gen)
    stats = collect_stats(src, calib)
    cfg, info, parts = convert_parts(src, stats, ConvertOptions(rope_dim=16, kv_rank=24))
    out = export(tmp_path / "mla", src, cfg, parts, info, {}, shard_bytes=1 << 20)  # several shards
    assert len(list(out.glob("*.safetensors"))) > 1

    whole = perplexity(lambda ids: source_logits(src, ids), windows)
    streamed = source_perplexity(src, windows)
    assert streamed["tokens"] == whole["tokens"] == 3 * 31
    assert streamed["ppl"] == pytest.approx(whole["ppl"], rel=1e-6)  # float32 sums in another order

    whole = perplexity(load_model(out, dtype=torch.float32).full_logits, windows)
    streamed = converted_perplexity(out, windows)
    assert streamed["ppl"] == pytest.approx(whole["ppl"], rel=1e-6)  # float32 sums in another order
    assert abs(streamed["nll"] - whole["nll"]) <= 1e-6 * whole["nll"]


def test_layerwise_perplexity_of_a_tied_single_shard_model(tmp_path):
    shape = dict(SHAPES["small"], num_hidden_layers=2, tie_word_embeddings=True)
    folder = write_random_llama(tmp_path / "rand", vocab_size=VOCAB, tokenizer=False, **shape)
    src = read_source(folder)
    gen = torch.Generator().manual_seed(1)
    windows = torch.randint(0, VOCAB, (2, 24), generator=gen)
    cfg, info, parts = convert_parts(src, collect_stats(src, windows), ConvertOptions(rope_dim=8, kv_rank=16))
    out = export(tmp_path / "mla", src, cfg, parts, info, {})
    assert (out / "model.safetensors").is_file()
    whole = perplexity(load_model(out, dtype=torch.float32).full_logits, windows)
    assert converted_perplexity(out, windows)["ppl"] == pytest.approx(whole["ppl"], rel=1e-6)
