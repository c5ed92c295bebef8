"""The transform-coded cache, simulated: the PCA-basis conversion stays exact at full width, the
energies order its directions, and the model reads its latent and rope key through the format."""

from __future__ import annotations

import torch

from latentkv.convert import bit_alloc
from latentkv.cache import transform_code as tc
from latentkv.convert.calibrate import collect_stats
from latentkv.convert.layout import converted_model
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model
from latentkv.convert.simulated import read_back, simulate
from latentkv.sources.readers import read_source
from latentkv.sources.reference import source_logits

import llama_tiny


def pca_conversion(tmp_path):
    llama_tiny.save("llama_gqa", tmp_path / "src")
    src = read_source(tmp_path / "src")
    windows = torch.randint(0, llama_tiny.VOCAB, (3, 48), generator=torch.Generator().manual_seed(2))
    stats = collect_stats(src, windows)
    options = ConvertOptions(rope_dim="all", kv_rank="full", rotate_latent=False)
    cfg, tensors, _ = build_model(src, stats, options)
    return src, stats, cfg, tensors


def test_the_pca_basis_conversion_is_exact_and_its_energies_ordered(tmp_path):
    src, stats, cfg, tensors = pca_conversion(tmp_path)
    ids = torch.randint(0, llama_tiny.VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))
    assert (converted_model(cfg, tensors).full_logits(ids) - source_logits(src, ids)).abs().max() <= 1e-3
    for lat, rope in bit_alloc.model_energies(cfg, tensors, stats, ConvertOptions().k_weight):
        assert torch.all(lat[:-1] >= lat[1:] * (1 - 1e-6)) and lat[0] > 0  # the spectrum, descending
        assert len(rope) == cfg["qk_rope_head_dim"] and torch.all(rope >= 0) and rope.sum() > 0


def test_the_model_reads_its_cache_through_the_format(tmp_path):
    _, stats, cfg, tensors = pca_conversion(tmp_path)
    layers, r, dr = cfg["num_hidden_layers"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    ids = torch.randint(0, llama_tiny.VOCAB, (1, 40), generator=torch.Generator().manual_seed(3))
    plain = converted_model(cfg, tensors)
    exact = plain.full_logits(ids)
    energies = bit_alloc.model_energies(cfg, tensors, stats, ConvertOptions().k_weight)
    code = bit_alloc.allocate(energies, layers * (r + dr) // 2)  # about 4 bits a value
    model = simulate(converted_model(cfg, tensors), code)
    # one layer's projections: the coded model returns the format's round trip of the plain one's
    x = torch.randn(40, cfg["hidden_size"])
    cos, sin = plain.model.rope_tables(torch.arange(40))
    q_nope, q_rope, c, k_r = plain.model.layers[0].self_attn.project(x, (cos[0], sin[0]))
    got = model.model.layers[0].self_attn.project(x, (cos[0], sin[0]))
    assert torch.equal(got[0], q_nope) and torch.equal(got[1], q_rope)
    assert torch.equal(got[2], tc.round_trip(c, list(code.latent_bits[0]), code.group))
    assert torch.equal(got[3], tc.round_trip(k_r, list(code.rope_bits[0]), code.group))
    coded = model.full_logits(ids)
    full = simulate(converted_model(cfg, tensors), tc.TransformCode(((8,) * r,) * layers, ((8,) * dr,) * layers))
    eight = full.full_logits(ids)
    assert (eight - exact).abs().max() < (coded - exact).abs().max()  # 8 bits everywhere: closer than ~4
    assert (eight - exact).abs().max() <= 0.05 * exact.abs().max()


def test_a_centred_code_reads_the_rope_key_less_its_mean_turned_by_position(tmp_path):
    _, stats, cfg, tensors = pca_conversion(tmp_path)
    layers, r, dr = cfg["num_hidden_layers"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    means = [bit_alloc.layer_means(cfg, tensors, i, st) for i, st in enumerate(stats)]
    code = tc.TransformCode(((3,) * r,) * layers, ((3,) * dr,) * layers).centred(
        [m[0] for m in means], [m[1] for m in means]
    )
    plain = converted_model(cfg, tensors)
    model = simulate(converted_model(cfg, tensors), code)
    x = torch.randn(40, cfg["hidden_size"])
    positions = torch.arange(40)
    cos, sin = plain.model.rope_tables(positions)
    _, _, c, k_r = plain.model.layers[1].self_attn.project(x, (cos[1], sin[1]))
    got = model.model.layers[1].self_attn.project(x, (cos[1], sin[1]))
    # the mean before RoPE, turned as RoPE turns a key at each position (written out: pairs 2i, 2i+1)
    f = plain.model.layers[1].self_attn.inv_freq.float()
    angle = positions[:, None].float() * f[None, :]
    mu = means[1][1].float()
    a, b = mu[0::2], mu[1::2]
    turned = torch.stack((a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()), -1).flatten(-2)
    assert cfg.get("rope_interleave", True)
    torch.testing.assert_close(got[3], tc.round_trip(k_r - turned, [3] * dr) + turned, atol=1e-5, rtol=1e-5)
    assert torch.equal(got[2], tc.round_trip(c, [3] * r, mean=means[1][0]))


def test_a_side_alone_is_read_through_the_code_the_rest_exact(tmp_path):
    _, _, cfg, tensors = pca_conversion(tmp_path)
    layers, r, dr = cfg["num_hidden_layers"], cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    ids = torch.randint(0, llama_tiny.VOCAB, (1, 24), generator=torch.Generator().manual_seed(5))
    exact = converted_model(cfg, tensors).full_logits(ids)
    model = converted_model(cfg, tensors)

    def distance(m):
        return float((m.full_logits(ids) - exact).abs().max())

    coarse = tc.TransformCode(((1,) * r,) * layers, ((1,) * dr,) * layers)
    kls = [tuple(distance(simulate(model, coarse, only=(i, s))) for s in ("latent", "rope")) for i in range(layers)]
    assert len(kls) == layers and all(k > 0 for pair in kls for k in pair)  # each side, coded, moves the logits
    fine = tc.TransformCode(((8,) * r,) * layers, ((8,) * dr,) * layers)
    fine_kls = [tuple(distance(simulate(model, fine, only=(i, s))) for s in ("latent", "rope")) for i in range(layers)]
    assert all(f < c for pf, pc in zip(fine_kls, kls) for f, c in zip(pf, pc))
    # the rest stays exact: a probe of layer 0's latent leaves layer 1's projections as they were
    simulate(model, coarse, only=(0, "latent"))
    x = torch.randn(8, cfg["hidden_size"])
    cos, sin = model.model.rope_tables(torch.arange(8))
    plain = converted_model(cfg, tensors).model.layers[1].self_attn.project(x, (cos[1], sin[1]))
    got = model.model.layers[1].self_attn.project(x, (cos[1], sin[1]))
    assert all(torch.equal(a, b) for a, b in zip(got, plain))


def test_under_autograd_the_read_back_is_straight_through():
    """The values read back are the format's bits; the gradient is the incoming one unchanged, where the
    rounding's own is zero almost everywhere; under bf16 autocast the codes are still made in float32."""
    bits = [8, 6, 4, 3, 2, 0, 5, 1]
    mean = torch.randn(len(bits)) * 0.1
    x = torch.randn(5, len(bits), requires_grad=True)
    read = read_back(x, bits, 4, mean)
    want = tc.round_trip(x.detach(), bits, 4, mean)
    assert torch.equal(read, want) and not torch.equal(want, x.detach())
    upstream = torch.randn_like(read)
    read.backward(upstream)
    assert torch.equal(x.grad, upstream)
    rounding = torch.randn(5, len(bits), requires_grad=True)
    tc.round_trip(rounding, bits, 4, mean).backward(upstream)  # the quantizer's own gradient: not the identity
    assert not torch.allclose(rounding.grad, upstream)
    with torch.no_grad():
        assert torch.equal(read_back(x, bits, 4, mean), want)
    y = x.detach().bfloat16().requires_grad_()
    want = tc.round_trip(y.detach().float(), bits, 4, mean).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the codes in float32 under autocast, as served
        read = read_back(y, bits, 4, mean)
    assert read.dtype == torch.bfloat16 and torch.equal(read, want)
