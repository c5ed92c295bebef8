"""KIVI-style K (per channel over tokens) and V (per token over channels) caches: levels, groups, bytes."""

from __future__ import annotations

import pytest
import torch

from latentkv.bench import kivi


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_each_group_holds_at_most_2_to_the_bits_levels_between_its_min_and_max(bits):
    x = torch.randn(1, 2, 70, 64, generator=torch.Generator().manual_seed(bits))
    store_k, store_v = kivi.round_trips(bits, 32, 32)
    k, v = store_k(x), store_v(x)
    for t0 in range(0, 70, 32):  # keys: each channel's values over a group of tokens
        g, ref = k[:, :, t0 : t0 + 32], x[:, :, t0 : t0 + 32]
        for ch in range(64):
            assert g[0, 1, :, ch].unique().numel() <= 2**bits
        step = (ref.amax(2) - ref.amin(2)) / (2**bits - 1)
        assert torch.all((g - ref).abs() <= step[:, :, None] / 2 + 1e-2 * ref.abs().max())
    for c0 in range(0, 64, 32):  # values: each token's values over a group of channels
        assert v[0, 0, 5, c0 : c0 + 32].unique().numel() <= 2**bits
    assert not torch.equal(k, v)  # different axes
    assert (kivi.quantize(x, 8, -1, 32) - x).abs().max() < 0.02


def test_bytes_count_codes_and_every_groups_scale_and_zero():
    # SmolLM2: 30 layers, 3 KV heads x 64; 2 bits + a 4-byte scale/zero per 32 values on both sides
    assert kivi.bytes_per_token(30, 3, 64, 2, 32, 32) == 30 * (2 * 192 * 2 / 8 + 2 * 192 * 4 / 32) == 4320
    assert kivi.bytes_per_token(30, 3, 64, 3, 32, 32) == 5760  # a quarter of the f16 cache
