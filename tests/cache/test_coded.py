"""A transform-coded layer in the paged cache (cache/coded.py): the packing against a bit string written
out here, the write and every reader against the simulated round trip (convert/simulated.py's
`transform_code.round_trip`, the rope key's mean turned by position), and the bytes against the format."""

from __future__ import annotations

import random

import pytest
import torch

from latentkv.attention import paged
from latentkv.cache import coded
from latentkv.cache import transform_code as tc
from latentkv.cache.accounting import latent_bytes_per_token
from latentkv.cache.latent_cache import LatentCache, allocate_caches
from latentkv.config import ModelConfig
from latentkv.facts import TRANSFORM_CODE
from latentkv.model import fused
from latentkv.rope import apply_rope, cos_sin

R, DR, BS = 12, 8, 4


def reference_pack(values: list[list[int]], widths: list[int]) -> list[list[int]]:
    """Each row's values as one bit string, least significant bit first, cut into bytes."""
    out = []
    for row in values:
        bits = [(v >> k) & 1 for v, w in zip(row, widths) for k in range(w)]
        bits += [0] * (-len(bits) % 8)
        out.append([sum(bit << k for k, bit in enumerate(bits[i : i + 8])) for i in range(0, len(bits), 8)])
    return out


def test_pack_is_a_bit_string_and_unpack_reads_it_back():
    rng = random.Random(0)
    widths = [rng.randint(1, 8) for _ in range(37)]
    values = [[rng.randrange(1 << w) for w in widths] for _ in range(5)]
    packed = coded.pack(torch.tensor(values), widths)
    assert packed.dtype == torch.uint8 and packed.tolist() == reference_pack(values, widths)
    assert coded.unpack(packed, widths).tolist() == values


def layer_code(seed: int = 0, centred: bool = True, factor: float = 1.0) -> coded.LayerCode:
    rng = random.Random(seed)
    latent = tuple(rng.choice((0, 1, 2, 3, 5, 8)) for _ in range(R))
    rope = tuple(rng.choice((0, 2, 4, 7)) for _ in range(DR))
    means = (tuple(rng.uniform(-2, 2) for _ in range(R)), tuple(rng.uniform(-2, 2) for _ in range(DR)))
    inv_freq = tuple(1.0 / 10000 ** (2 * i / DR) for i in range(DR // 2))
    return coded.LayerCode(latent, rope, 3, *(means if centred else (None, None)), inv_freq, factor, seed % 2 == 0)


def simulated(code: coded.LayerCode, c, k_r, positions):
    """What convert/simulated.py's model reads back for rows c [T, R], k_r [T, DR] at positions [T]."""
    c_mean = k_mean = None
    if code.latent_mean is not None:
        cos, sin = code.angles(positions)
        c_mean = torch.tensor(code.latent_mean)
        k_mean = apply_rope(torch.tensor(code.rope_mean).expand(len(positions), 1, -1), cos, sin, code.interleaved)
        k_mean = k_mean[:, 0]
    lat = tc.round_trip(c, list(code.latent_bits), code.group, c_mean)
    return torch.cat((lat, tc.round_trip(k_r, list(code.rope_bits), code.group, k_mean)), dim=-1)


@pytest.mark.parametrize("centred", [True, False])
@pytest.mark.parametrize("factor", [1.0, 1.25])
def test_every_reader_gives_back_the_simulated_round_trip(centred, factor):
    code = layer_code(1 if centred else 2, centred, factor)
    cache = LatentCache(8, BS, R, DR, torch.float32, TRANSFORM_CODE, code=code)
    assert [(p.name, p.dtype, p.shape) for p in cache.parts] == [
        ("latent", torch.uint8, (code.code_bytes,)),
        ("scale", torch.float16, (code.scales,)),
    ]
    assert code.nbytes == tc.layer_bytes(list(code.latent_bits), list(code.rope_bits), code.group)
    torch.manual_seed(0)
    length = 3 * BS - 1
    c, k_r = torch.randn(length, R) * 3, torch.randn(length, DR)
    positions = torch.arange(length)
    table = torch.tensor([[5, 2, 7]])  # the sequence's blocks, out of order
    slots = table[0, positions // BS] * BS + positions % BS
    paged.write(cache, c, k_r, slots, code.angles(positions))
    want = simulated(code, c, k_r, positions)
    assert torch.equal(paged.gather(cache, table)[0, :length], want)
    assert torch.equal(
        paged.read_positions(cache, table, torch.tensor([length]), BS, 3 * BS)[0, : length - BS], want[BS:]
    )
    pieces = paged.pieces(cache, [(5, 1), (2, 1), (7, 1)], length)
    assert torch.equal(torch.cat(pieces, dim=1)[0], want)
    with pytest.raises(ValueError, match="RoPE angles"):
        paged.write(cache, c, k_r, slots)


@pytest.mark.skipif(not fused.available(), reason="the fused ops are not built here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed,centred,factor", [(1, True, 1.0), (2, True, 1.25), (4, False, 1.0), (5, True, 1.0)])
@torch.no_grad()
def test_the_native_writer_stores_the_reference_writers_bits(dtype, seed, centred, factor):
    """decode_ops coded_write (the layers' and the decode plan's writer: rope on k_r, then the code) stores
    the codes and scales the reference stores (rope.apply_rope, then paged.write: coded.encode and pack),
    bit for bit: it runs their torch ops in their order and packs the same bits."""
    code = layer_code(seed, centred, factor)
    ours, ref = (LatentCache(8, BS, R, DR, dtype, TRANSFORM_CODE, code=code) for _ in range(2))
    gen = torch.Generator().manual_seed(seed)
    kv = (torch.randn(19, R + DR + 3, generator=gen) * 3).to(dtype)  # c and k_r: strided views
    c, k_r = kv[:, :R], kv[:, R : R + DR]
    positions = torch.randint(0, 5000, (19,), generator=gen)
    slots = torch.randperm(8 * BS, generator=gen)[:19]
    cos, sin = code.angles(positions)
    fused.write_latent(ours, c, k_r, slots, (cos, sin, code.interleaved), kernel=True)
    paged.write(ref, c, apply_rope(k_r[:, None], cos, sin, code.interleaved)[:, 0], slots, (cos, sin))
    assert ref.latent.any() and torch.equal(ours.latent, ref.latent) and torch.equal(ours.scale, ref.scale)


@pytest.mark.skipif(not fused.available(), reason="the fused ops are not built here")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed,centred,factor", [(1, True, 1.0), (2, True, 1.25), (4, False, 1.0), (5, True, 1.0)])
def test_the_native_reader_gives_the_reference_readers_rows(dtype, seed, centred, factor):
    """coded.decode (decode_ops coded_read where the fused ops run, as every reader of the cache calls it)
    gives reference_decode's rows bit for bit: random codes of every width, scales, positions."""
    code = layer_code(seed, centred, factor)
    gen = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (37, code.code_bytes), generator=gen, dtype=torch.uint8)
    scales = (torch.rand(37, code.scales, generator=gen) * 3 + 0.01).half()
    positions = torch.randint(0, 70000, (37,), generator=gen)
    got = coded.decode(code, packed, scales, positions, dtype)
    assert got.dtype == dtype and torch.equal(got, coded.reference_decode(code, packed, scales, positions, dtype))


def tiny_config(code: tc.TransformCode | None) -> ModelConfig:
    extensions = {"kv_lora_ranks": [R, R - 2]} | ({} if code is None else {"cache_format": code.to_dict()})
    return ModelConfig.from_dict(
        dict(
            model_type="deepseek_v3",
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            kv_lora_rank=R,
            qk_nope_head_dim=8,
            qk_rope_head_dim=DR,
            v_head_dim=8,
            latentkv=extensions,
        )
    )


def test_the_cache_holds_the_bytes_the_format_says_layers_apart():
    code = tc.TransformCode(((8, 4, 4, 2, 0) + (1,) * (R - 5), (3,) * (R - 2)), ((6,) * DR, (2,) * 4 + (0,) * 4))
    cfg = tiny_config(code)
    caches = allocate_caches(cfg, 3, BS, torch.float32, TRANSFORM_CODE)
    per_layer = [code.layer_bytes(i) for i in range(2)]
    assert [c.nbytes() // (3 * BS) for c in caches] == per_layer and per_layer[0] != per_layer[1]
    for dtype in ("float32", "bfloat16"):
        assert latent_bytes_per_token(cfg, TRANSFORM_CODE, dtype) == code.bytes_per_token() == sum(per_layer)
    with pytest.raises(ValueError, match="records no cache format"):
        latent_bytes_per_token(tiny_config(None), TRANSFORM_CODE)


def test_a_layer_code_that_does_not_fit_the_model_is_refused():
    code = tc.TransformCode(((2,) * (R + 1), (2,) * (R - 2)), ((2,) * DR, (2,) * DR))
    with pytest.raises(ValueError, match="layer 0 codes 13 \\+ 8 directions, the model caches 12 \\+ 8"):
        allocate_caches(tiny_config(code), 1, BS, torch.float32, TRANSFORM_CODE)


def test_the_rope_mean_turns_as_the_model_turns_its_key():
    code = layer_code(3)
    positions = torch.tensor([0, 5, 17])
    cos, sin = cos_sin(positions, torch.tensor(code.inv_freq))
    assert torch.equal(code.angles(positions)[0], cos * code.rope_factor)
    turned = code.turned_mean(*code.angles(positions))
    assert torch.allclose(turned[0], torch.tensor(code.rope_mean))  # position 0: unturned
    assert torch.allclose(turned.norm(dim=-1), turned[0].norm().expand(3), rtol=1e-5)  # a rotation


def test_a_tokens_codes_do_not_depend_on_the_rows_written_with_it():
    """The writer's turn is one fixed-order product per side: a token written alone or among 37 others
    gets the same bytes (what greedy text identical alone and batched rests on)."""
    rng = random.Random(4)
    r, dr = 48, 16
    bits = (tuple(rng.choice((0, 2, 3, 5, 8)) for _ in range(r)), tuple(rng.choice((3, 6)) for _ in range(dr)))
    code = coded.LayerCode(*bits, 16, None, None, tuple([0.5] * (dr // 2)))
    gen = torch.Generator().manual_seed(0)
    c, k_r = torch.randn(38, r, generator=gen), torch.randn(38, dr, generator=gen)
    cos, sin = cos_sin(torch.arange(38), torch.tensor(code.inv_freq))
    codes, scales = coded.encode(code, c, k_r, cos, sin)
    for i in (0, 7, 37):
        one = coded.encode(code, c[i : i + 1], k_r[i : i + 1], cos[i : i + 1], sin[i : i + 1])
        assert torch.equal(one[0][0], codes[i]) and torch.equal(one[1][0], scales[i])
