"""`resolve_sizes`: what a conversion with no size option, or a cache ratio alone, becomes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from latentkv.convert.api import DEFAULT_CACHE_DTYPE, DEFAULT_STOCK_RATIO, resolve_sizes
from latentkv.convert.options import ConvertOptions
from latentkv.convert.sweep import pick_served_default

# SmolLM2-135M's attention shape: 3 KV heads x 64 dims = 384 cache elements per token per layer
SMOL = SimpleNamespace(num_kv_heads=3, head_dim=64, qkv_bias=False, kv_elements=lambda: 384)
FRONTIER = Path(__file__).parents[2] / "docs" / "results" / "frontier" / "xeon" / "frontier.json"


def test_no_size_option_is_the_exact_conversion_in_the_default_cache():
    settings = resolve_sizes(SMOL, ConvertOptions())
    assert (settings.rope_dim, settings.kv_rank, settings.cache_dtype) == ("all", "full", DEFAULT_CACHE_DTYPE)
    assert resolve_sizes(SMOL, ConvertOptions(cache_dtype="int8")).cache_dtype == "int8"  # the user's format stays


def test_the_default_is_what_the_measured_frontier_picks_by_the_rule():
    measured = json.loads(FRONTIER.read_text())  # the bundled SmolLM2's frontier (docs/conversion.md)
    chosen = pick_served_default(measured["rows"], measured["original_ppl"])
    assert chosen is not None
    rope, rank, fmt = re.search(r"\(rope (\d+) \+ rank (\d+), (\w+)\)", chosen["system"]).groups()
    exact = SMOL.num_kv_heads * SMOL.head_dim  # all rope dims kept: the latent holds V alone
    assert (int(rope), int(rank), fmt) == (exact, exact, DEFAULT_CACHE_DTYPE)


def test_stock_with_no_size_starts_from_the_stock_ratio():
    settings = resolve_sizes(SMOL, ConvertOptions(stock=True, target="any"))
    assert settings.rope_dim + settings.kv_rank == round(DEFAULT_STOCK_RATIO * 384) and settings.cache_dtype is None


@pytest.mark.parametrize("ratio,rope", [(0.5, 64), (0.25, 32)])
def test_a_small_cache_caps_the_rope_dim_at_a_third_of_it(ratio, rope):
    settings = resolve_sizes(SMOL, ConvertOptions(cache_ratio=ratio))
    assert settings.rope_dim == rope and settings.rope_dim + settings.kv_rank == round(ratio * 384)
