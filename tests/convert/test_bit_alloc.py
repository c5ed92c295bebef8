"""Reverse water-filling: the allocation against a brute force, and within its bytes."""

from __future__ import annotations

import itertools

import pytest
import torch

from latentkv.convert import bit_alloc
from latentkv.convert import transform_code as tc


@pytest.mark.parametrize("budget", [1, 2, 3, 4])
def test_the_allocation_is_the_brute_force_optimum_on_a_tiny_layer(budget):
    """Two latent and two rope directions, code bits only (no scales): the least modelled error
    of every bits vector whose codes fit `budget` bytes."""
    lat, rope = torch.tensor([9.0, 0.7]), torch.tensor([3.0, 0.05])
    energies = torch.cat([lat, rope])
    code = bit_alloc.allocate([(lat, rope)], budget, group=64, scale_bytes=0)
    got = tc.expected_error(energies, list(code.latent_bits[0] + code.rope_bits[0]))
    best = min(
        tc.expected_error(energies, list(b))
        for b in itertools.product(range(tc.MAX_BITS + 1), repeat=4)
        if -(-sum(b) // 8) <= budget
    )
    assert got == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("kv_bytes", [20, 45, 60, 200])
def test_the_bytes_fit_and_layers_and_sides_get_bits_by_energy(kv_bytes):
    gen = torch.Generator().manual_seed(kv_bytes)
    energies = [
        (torch.rand(24, generator=gen) * 10.0**-k, torch.rand(8, generator=gen) * 10.0 ** (1 - k)) for k in range(3)
    ]
    code = bit_alloc.allocate(energies, kv_bytes)
    assert code.bytes_per_token() <= kv_bytes
    flat_e = torch.cat([torch.cat(e) for e in energies])
    flat_b = torch.tensor([b for lat, rope in zip(code.latent_bits, code.rope_bits) for b in lat + rope])
    # more energy never gets fewer bits (bits ~ log-variance)
    order = flat_e.argsort(descending=True)
    assert torch.all(flat_b[order][:-1] >= flat_b[order][1:])
    assert 0 < int(flat_b.sum()) and int(flat_b.max()) <= tc.MAX_BITS
    if kv_bytes == 60:  # room to spare: the high-energy layer gets more than the low one
        assert sum(code.latent_bits[0]) > sum(code.latent_bits[2])


def test_a_budget_with_no_room_for_one_direction_is_refused():
    with pytest.raises(ValueError, match="hold no coded direction"):
        bit_alloc.allocate([(torch.ones(4), torch.ones(2))], 2)


def test_a_rope_pair_shares_its_energy():
    assert bit_alloc.pair_mean(torch.tensor([1.0, 3.0, 5.0, 7.0]), True).tolist() == [2.0, 2.0, 6.0, 6.0]
    assert bit_alloc.pair_mean(torch.tensor([1.0, 3.0, 5.0, 7.0]), False).tolist() == [3.0, 5.0, 3.0, 5.0]
