"""`resolve_sizes`: what a conversion with no size option, or a cache ratio alone, becomes."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from latentkv.convert.api import DEFAULT_CACHE_RATIO, DEFAULT_ROPE_DIM, resolve_sizes
from latentkv.convert.options import ConvertOptions
from latentkv.convert.sweep import pick_default

# SmolLM2-135M's attention shape: 3 KV heads x 64 dims = 384 cache elements per token per layer
SMOL = SimpleNamespace(num_kv_heads=3, head_dim=64, qkv_bias=False, kv_elements=lambda: 384)
SWEEP = Path(__file__).parents[2] / "docs" / "conversion-sweep-chat" / "sweep.json"


def test_no_size_option_is_the_default_split_of_the_default_cache():
    settings = resolve_sizes(SMOL, ConvertOptions())
    assert settings.rope_dim == DEFAULT_ROPE_DIM
    assert settings.rope_dim + settings.kv_rank == round(DEFAULT_CACHE_RATIO * 384)


def test_the_default_is_the_size_the_measured_sweep_picks_by_the_rule():
    measured = json.loads(SWEEP.read_text())   # the bundled SmolLM2's behaviour sweep (docs/conversion.md)
    chosen = pick_default(measured["rows"])
    assert chosen is not None and measured["default"]["kv_rank"] == chosen["kv_rank"]
    settings = resolve_sizes(SMOL, ConvertOptions())
    assert (settings.rope_dim, settings.kv_rank) == (chosen["rope_dim"], chosen["kv_rank"])


@pytest.mark.parametrize("ratio,rope", [(0.5, 64), (0.25, 32)])
def test_a_small_cache_caps_the_rope_dim_at_a_third_of_it(ratio, rope):
    settings = resolve_sizes(SMOL, ConvertOptions(cache_ratio=ratio))
    assert settings.rope_dim == rope and settings.rope_dim + settings.kv_rank == round(ratio * 384)
