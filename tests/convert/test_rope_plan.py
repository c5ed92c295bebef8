"""RoPE planning's phase window (rope_plan.near, ConvertOptions.rope_window) against its definition,
and what it is for: short chat prompts scored closer to the original."""

from __future__ import annotations

import cmath
import pytest
import torch

from latentkv.convert import rope_plan
from latentkv.convert.api import calibration_windows
from latentkv.convert.calibrate import collect_stats
from latentkv.convert.layout import converted_model
from latentkv.convert.options import ConvertOptions
from latentkv.convert.pipeline import build_model, layer_energy, plan_rope
from latentkv.eval.chat import ChatModel, render_cases, score_case
from latentkv.sources.chat_data import load_chat
from latentkv.sources.readers import read_source
from latentkv.sources.reference import source_logits

import llama_tiny


def naive_phase(dist: torch.Tensor, freqs: torch.Tensor, window: int) -> torch.Tensor:
    """E_h[e^{i f Δ}] over the distances Δ < window only, summed term by term."""
    out = torch.zeros(dist.shape[0], len(freqs), dtype=torch.complex128)
    for h in range(dist.shape[0]):
        mass = sum(float(dist[h, delta]) for delta in range(window))
        for j, f in enumerate(freqs.tolist()):
            out[h, j] = sum(float(dist[h, delta]) * cmath.exp(1j * f * delta) for delta in range(window)) / mass
    return out


def test_the_phase_over_a_window_is_the_mean_phase_of_its_distances():
    dist = torch.rand(3, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    freqs = torch.tensor([1.0, 0.3, 0.05, 0.001], dtype=torch.float64)
    for window in (1, 7, 25):
        assert torch.allclose(
            rope_plan.phase_means(rope_plan.near(dist, window), freqs), naive_phase(dist, freqs, window), atol=1e-12
        )
    assert rope_plan.near(dist, None) is dist and rope_plan.near(dist, 40) is dist  # every distance: unchanged
    assert torch.equal(rope_plan.near(dist, 7)[:, :7], dist[:, :7]) and not rope_plan.near(dist, 7)[:, 7:].any()


def test_native_plans_fold_the_windowed_phase_and_rank_over_every_distance(tmp_path):
    llama_tiny.save("llama_gqa", tmp_path / "src")
    src = read_source(tmp_path / "src")
    ids = torch.randint(0, llama_tiny.VOCAB, (2, 48), generator=torch.Generator().manual_seed(0))
    stats = collect_stats(src, ids)
    window, S = 6, 4
    plans, _, _, _ = plan_rope(src, stats, ConvertOptions(rope_dim=2 * S, rope_window=window))
    whole, _, _, _ = plan_rope(src, stats, ConvertOptions(rope_dim=2 * S, rope_window=None))
    for i, (plan, st) in enumerate(zip(plans, stats)):
        phi = naive_phase(st.dist, src.inv_freq.double(), window)
        assert torch.allclose(plan.nope_phase, phi, atol=1e-10)
        e, phi_all = layer_energy(src, i, st)  # [H, Hkv, P] score energy per head and pair; φ over every distance
        cost = (e * (1 - phi_all.abs() ** 2)[:, None, :]).sum(0)  # ranked over every distance
        best = {divmod(int(k), cost.shape[1]) for k in cost.flatten().argsort(descending=True)[:S]}
        assert {tuple(pair) for pair in plan.kept.tolist()} == best
    # the whole calibration window as the window is the unwindowed plan, bit for bit
    full, _, _, _ = plan_rope(src, stats, ConvertOptions(rope_dim=2 * S, rope_window=48))
    for a, b in zip(full, whole):
        assert torch.equal(a.kept, b.kept) and torch.equal(a.nope_phase, b.nope_phase)
    assert all(torch.equal(a.kept, b.kept) for a, b in zip(plans, whole))  # the window moves φ only
    assert any(not torch.equal(a.nope_phase, b.nope_phase) for a, b in zip(plans, whole))


def test_stock_plans_ignore_the_window(tmp_path):
    llama_tiny.save("llama_gqa", tmp_path / "src")
    src = read_source(tmp_path / "src")
    stats = collect_stats(src, torch.randint(0, llama_tiny.VOCAB, (2, 48), generator=torch.Generator().manual_seed(1)))
    a = plan_rope(src, stats, ConvertOptions(rope_dim=8, stock=True, rope_window=4))[0]
    b = plan_rope(src, stats, ConvertOptions(rope_dim=8, stock=True, rope_window=None))[0]
    assert all(torch.equal(x.rope_phase, y.rope_phase) and torch.equal(x.kept, y.kept) for x, y in zip(a, b))


@pytest.mark.slow  # the real SmolLM2, converted
def test_the_window_brings_short_chat_prompts_closer_to_the_original(smollm2, smollm2_tokenizer):
    """Rope 64 at the full latent: only the RoPE truncation differs from the source. Over the
    whole 512-token calibration windows the folded phases fit long contexts; over the default
    window they fit a chat prompt, and the held-out prompts' KL against the original falls."""
    windows, _ = calibration_windows(smollm2, None, 4 * 512, 512, calib_chat=0.5)
    stats = collect_stats(smollm2, windows)
    cases = render_cases(smollm2_tokenizer, load_chat(smollm2.path, "heldout")[:6])
    ref = ChatModel(lambda ids: source_logits(smollm2, ids), smollm2_tokenizer, "source", "src", memoize=True)
    kl = {}
    for window in (None, ConvertOptions().rope_window):
        options = ConvertOptions(rope_dim=64, kv_rank="full", rope_window=window)
        cfg, tensors, _ = build_model(smollm2, stats, options)
        model = converted_model(cfg, tensors)
        mine = ChatModel(lambda ids: model.full_logits(ids), smollm2_tokenizer, "mla", "x")
        per = [score_case(mine, ref, c) for c in cases]
        kl[window] = sum(p["kl_sum"] for p in per) / sum(p["positions"] for p in per)
    assert kl[ConvertOptions().rope_window] < 0.7 * kl[None], kl
