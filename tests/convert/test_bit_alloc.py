"""Reverse water-filling: the allocation against a brute force, and within its bytes."""

from __future__ import annotations

import itertools

import pytest
import torch

from latentkv.convert import bit_alloc
from latentkv.cache import transform_code as tc


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


@pytest.mark.parametrize("budget", [3, 6, 10, 16])
def test_a_side_water_filled_is_the_brute_force_optimum(budget):
    """One side of four directions, code bits only (no scales): the least modelled error of every
    bits vector within `budget` bits."""
    energy = torch.tensor([5.0, 2.0, 0.3, 0.01])
    got = tc.expected_error(energy, bit_alloc.waterfill_side(energy, budget, scale_bytes=0))
    best = min(
        tc.expected_error(energy, list(b))
        for b in itertools.product(range(tc.MAX_BITS + 1), repeat=4)
        if sum(b) <= budget
    )
    assert got == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("budget", [40, 100, 300, 500, 900, 2000])
def test_the_uniform_side_is_the_most_bits_every_direction_shares(budget):
    bits = bit_alloc.uniform_side(96, budget, group=32)
    assert bit_alloc.side_bits(bits, 32) <= budget
    b = min(bits)
    assert max(bits) - b <= 1 and bits == sorted(bits, reverse=True)
    if b > 0:  # one more bit everywhere does not fit
        assert b == tc.MAX_BITS or bit_alloc.side_bits([b + 1] * 96, 32) > budget
    else:  # below a bit a value: as many 1-bit directions as fit
        assert bit_alloc.side_bits([1] * (bits.count(1) + 1), 32) > budget


def skewed_energies():
    """Three layers; layer 0's latent (its values) a thousand times weaker than the rest, as the
    first-order model calls the bundled model's layer 0 values."""
    gen = torch.Generator().manual_seed(0)
    spectrum = torch.logspace(0, -3, 64, dtype=torch.float64)
    return [
        (spectrum * (1e-4 if i == 0 else 1.0), torch.rand(64, generator=gen, dtype=torch.float64) * 0.5 + 0.5)
        for i in range(3)
    ]


@pytest.mark.parametrize("kv_bytes", [3 * 24, 3 * 48, 3 * 64])
def test_no_side_loses_its_directions_where_the_uniform_code_gives_it_bits(kv_bytes):
    energies = skewed_energies()
    sizes = [(len(lat), len(rope)) for lat, rope in energies]
    floor = bit_alloc.uniform(sizes, kv_bytes)
    # the global water-filling drops layer 0's values (what went wrong on the bundled model)
    assert not any(bit_alloc.allocate(energies, kv_bytes).latent_bits[0])
    code = bit_alloc.allocate_sides(energies, kv_bytes)
    assert code.bytes_per_token() <= kv_bytes and floor.bytes_per_token() <= kv_bytes
    for i, (lat, rope) in enumerate(energies):
        for energy, got, flat in (
            (lat, code.latent_bits[i], floor.latent_bits[i]),
            (rope, code.rope_bits[i], floor.rope_bits[i]),
        ):
            assert any(flat) and any(got)  # the floor codes every side here, and so does the allocation
            assert tc.expected_error(energy, list(got)) <= tc.expected_error(energy, list(flat)) * (1 + 1e-12)
    # within a side the bits follow the energy: the spectrum's head gets more than its tail
    assert code.latent_bits[1][0] > code.latent_bits[1][-1]
