"""model/deepseek.py's rope tables: layers of one frequency set share one table, with the bits each
layer's own table would have; layers that rotate differently keep their own."""

import torch

from latentkv.model.deepseek import rope_tables
from latentkv.rope import cos_sin

POSITIONS = torch.arange(37) + 5


def frequencies(layers: int) -> torch.Tensor:
    return (1.0 / 10000 ** (torch.arange(0, 16, 2) / 16)).repeat(layers, 1)  # [layers, 8]


def test_layers_of_one_frequency_set_share_one_table_with_each_layers_bits():
    inv = frequencies(4)
    for factor in (1.0, 0.7):
        cos, sin = rope_tables(POSITIONS, inv, factor)
        ref_cos, ref_sin = cos_sin(POSITIONS, inv)
        if factor != 1.0:
            ref_cos, ref_sin = ref_cos * factor, ref_sin * factor
        assert cos.shape == sin.shape == (4, 37, 8)
        assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)
        assert cos.stride(0) == sin.stride(0) == 0  # one table, expanded
        assert cos[2].is_contiguous()  # what a layer reads


def test_layers_of_different_frequencies_keep_their_own_tables():
    inv = frequencies(3)
    inv[1] *= 0.5
    cos, sin = rope_tables(POSITIONS, inv, 1.0)
    ref_cos, ref_sin = cos_sin(POSITIONS, inv)
    assert torch.equal(cos, ref_cos) and torch.equal(sin, ref_sin)
    assert not torch.equal(cos[0], cos[1]) and torch.equal(cos[0], cos[2])
