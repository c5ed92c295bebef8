"""The vectorized calibration statistics against their definitions, computed naively."""

from __future__ import annotations

import pytest
import torch

from latentkv.convert.calibrate import collect_stats
from latentkv.model.norm import rms_norm
from latentkv.rope import cos_sin, rotate
from latentkv.sources import reference as ref
from latentkv.sources.readers import read_source

import llama_tiny


def naive_first_layer(src, ids, w=None):
    """(xx, dist, rho, kappa) of layer 0 straight from the definitions (V repeated, W_o at full width),
    position (b, m) counted w[b, m] times (None: once)."""
    w = torch.ones(ids.shape, dtype=torch.float64) if w is None else w.double()
    layer = src.layer(0)
    H, Hkv, d, T = src.num_heads, src.num_kv_heads, src.head_dim, ids.shape[1]
    x = rms_norm(ref.embed(src, ids), layer["attn_norm"], src.rms_norm_eps)
    xa = torch.cat([x, torch.ones(*x.shape[:2], 1)], -1).reshape(-1, x.shape[-1] + 1).double()
    q, k, v = ref.project_qkv(src, layer, x)
    cos, sin = cos_sin(torch.arange(T), src.inv_freq)
    q, k = rotate(q, cos, sin, interleaved=False), rotate(k, cos, sin, interleaved=False)
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    scores = (q @ k.transpose(-1, -2)) * d**-0.5
    probs = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1).double()
    dist = torch.stack(
        [
            torch.stack([(probs[:, h].diagonal(-delta, -2, -1) * w[:, delta:]).sum() for delta in range(T)])
            for h in range(H)
        ]
    )
    wo = layer["o"].double().view(-1, H, d)
    u = torch.einsum("bhnd,xhd->bhnx", v.double(), wo)  # W_o,h v_n
    o = probs @ u  # W_o,h o_m
    p2 = probs**2
    per_query = (p2 * ((u[:, :, None] - o[:, :, :, None]) ** 2).sum(-1)).sum(3)  # [B, H, T]
    wq = w[:, None, :]
    n = w.sum()
    return (xa * w.reshape(-1, 1)).T @ xa / n, dist, (p2.sum(3) * wq).sum((0, 2)) / n, (per_query * wq).sum((0, 2)) / n


def test_statistics_match_their_definitions(tmp_path):
    llama_tiny.save("llama_gqa", tmp_path / "src")
    src = read_source(tmp_path / "src")
    ids = torch.randint(0, llama_tiny.VOCAB, (3, 24), generator=torch.Generator().manual_seed(0))
    st = collect_stats(src, ids, batch=2)[0]  # two batches: the running sums add up
    xx, dist, rho, kappa = naive_first_layer(src, ids)
    for name, got, want in [
        ("xx", st.xx, xx),
        ("dist", st.dist, dist),
        ("rho", st.rho, rho),
        ("kappa", st.kappa, kappa),
    ]:
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-6 * float(want.abs().max())), name
    assert st.tokens == ids.numel()


def test_bfloat16_forward_keeps_the_statistics_close(tmp_path):
    """--calib-dtype bfloat16 rounds the projections and the MLP only: the next layer's statistics
    move by bf16 rounding, not more."""
    llama_tiny.save("llama_gqa", tmp_path / "src")
    src = read_source(tmp_path / "src")
    ids = torch.randint(0, llama_tiny.VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
    full, low = collect_stats(src, ids), collect_stats(src, ids, dtype=torch.bfloat16)
    assert torch.equal(full[0].xx, low[0].xx)  # the first layer's input is the embedding either way
    for name in ("xx", "dist", "rho", "kappa"):
        a, b = getattr(full[1], name), getattr(low[1], name)
        assert not torch.equal(a, b) and float((a - b).abs().max() / a.abs().max()) < 0.05, name


def test_weighted_statistics_match_their_definitions(tmp_path):
    """Position weights: every statistic is the weighted mean over positions (queries for the
    attention statistics) of the definitions."""
    llama_tiny.save("llama_gqa", tmp_path / "src")
    src = read_source(tmp_path / "src")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, llama_tiny.VOCAB, (3, 24), generator=g)
    w = torch.rand(3, 24, generator=g) * 4
    st = collect_stats(src, ids, batch=2, weights=w)[0]
    xx, dist, rho, kappa = naive_first_layer(src, ids, w)
    for name, got, want in [
        ("xx", st.xx, xx),
        ("dist", st.dist, dist),
        ("rho", st.rho, rho),
        ("kappa", st.kappa, kappa),
    ]:
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-6 * float(want.abs().max())), name
    assert st.tokens == ids.numel()


def test_weights_of_one_reproduce_the_unweighted_statistics_exactly(tmp_path):
    llama_tiny.save("llama_gqa", tmp_path / "src")
    src = read_source(tmp_path / "src")
    ids = torch.randint(0, llama_tiny.VOCAB, (3, 24), generator=torch.Generator().manual_seed(0))
    plain, ones = collect_stats(src, ids, batch=2), collect_stats(src, ids, batch=2, weights=torch.ones(3, 24))
    for a, b in zip(plain, ones):
        for name in ("xx", "dist", "rho", "kappa"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.tokens == b.tokens


def close(got, want) -> bool:
    """Equal to float32 rounding (the per-batch products are float32)."""
    return torch.allclose(got, want, rtol=1e-5, atol=1e-6 * float(want.abs().max()))


def test_weights_move_every_layer_toward_the_weighted_windows(tmp_path):
    """Windows are independent, so weighting one window w times is its statistics counted w times,
    in every layer: weight 0 drops a window, weight 3 puts the mixture 3:1 toward it."""
    llama_tiny.save("llama_gqa", tmp_path / "src")
    src = read_source(tmp_path / "src")
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, llama_tiny.VOCAB // 2, (1, 16), generator=g)  # two different token ranges
    b = torch.randint(llama_tiny.VOCAB // 2, llama_tiny.VOCAB, (1, 16), generator=g)
    ids = torch.cat([a, b])
    only_a, only_b = collect_stats(src, a), collect_stats(src, b)
    dropped = collect_stats(src, ids, batch=1, weights=torch.tensor([[1.0] * 16, [0.0] * 16]))
    toward_b = collect_stats(src, ids, batch=1, weights=torch.tensor([[1.0] * 16, [3.0] * 16]))
    plain = collect_stats(src, ids, batch=1)
    for i in range(len(plain)):
        for name in ("xx", "rho", "kappa"):
            sa, sb = getattr(only_a[i], name), getattr(only_b[i], name)
            assert close(getattr(dropped[i], name), sa), name
            assert close(getattr(toward_b[i], name), (sa + 3 * sb) / 4), name
            # nearer b than the unweighted mean is
            assert (getattr(toward_b[i], name) - sb).norm() < (getattr(plain[i], name) - sb).norm(), name
        assert close(dropped[i].dist, only_a[i].dist)
        assert close(toward_b[i].dist, only_a[i].dist + 3 * only_b[i].dist)


def test_weights_must_match_the_windows(tmp_path):
    llama_tiny.save("llama_gqa", tmp_path / "src")
    src = read_source(tmp_path / "src")
    with pytest.raises(ValueError, match="do not match"):
        collect_stats(src, torch.zeros(2, 8, dtype=torch.long), weights=torch.ones(2, 7))
