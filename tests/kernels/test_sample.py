"""kernels/sample.py: the native sampler's rows against the PyTorch reference (engine/sampler.py
`truncate`, a stable sort, and `inverse_cdf`), on every ISA path this CPU runs."""

import math

import pytest
import torch

from latentkv.engine.sampler import inverse_cdf, truncate
from latentkv.kernels import sample

pytestmark = pytest.mark.skipif(not sample.available(), reason="the native sampler is not built here")


def paths():
    return sample.EXT.supported_isas()


def settings(n, gen, vocab):
    """n rows of (temperature, top_k, top_p, min_p): every kind of truncation, alone and together."""
    t = torch.tensor([0.3, 0.7, 1.0, 1.6])[torch.randint(0, 4, (n,), generator=gen)]
    k = torch.tensor([0, 1, 5, 50, vocab - 1, vocab, vocab + 7])[torch.randint(0, 7, (n,), generator=gen)]
    p = torch.tensor([1.0, 0.95, 0.9, 0.5, 0.1])[torch.randint(0, 5, (n,), generator=gen)]
    m = torch.tensor([0.0, 0.0, 0.05, 0.3])[torch.randint(0, 4, (n,), generator=gen)]
    return t, k, p, m


def reference(logits, t, k, p, m, u):
    """The reference sampler: truncate(logits / T) (stable sort), then inverse CDF with the same u."""
    sub = truncate(logits / t[:, None], k.tolist(), p.tolist(), m.tolist())
    return inverse_cdf(sub, u), sub


@pytest.mark.parametrize("vocab", [7, 3000, 49152, 129280])
def test_tokens_equal_the_reference_on_every_path(vocab):
    gen = torch.Generator().manual_seed(vocab)
    n = 48 if vocab < 100000 else 12
    logits = torch.randn(n, vocab, generator=gen) * torch.tensor([1.0, 3.0, 8.0])[torch.arange(n) % 3, None]
    t, k, p, m = settings(n, gen, vocab)
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    want, _ = reference(logits, t, k, p, m, u)
    for isa in paths():
        got = sample.sample_rows(logits, torch.arange(n), t, k, p, m, u, isa)
        assert got.tolist() == want.tolist(), f"path {isa}"


def test_kept_set_equals_the_sorted_reference_at_ties_and_edge_values():
    """Integer logits: many exact ties at the top-k and top-p cuts (the lower index stays first); top_p
    near 0 (the top token alone) and 1, top_k 1, V - 1, V and past V, min_p 1 (the tied maxima)."""
    gen = torch.Generator().manual_seed(1)
    vocab = 40
    rows = []
    for t in (0.5, 1.0, 2.0):
        for k in (0, 1, 3, 17, vocab - 1, vocab, vocab + 5):
            for p in (1e-6, 0.3, 0.77, 1.0):
                for m in (0.0, 0.2, 1.0):
                    rows.append((t, k, p, m))
    n = len(rows)
    logits = torch.randint(-3, 3, (n, vocab), generator=gen).float()
    t, k, p, m = (torch.tensor(c) for c in zip(*rows))
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    _, sub = reference(logits, t, k, p, m, u)
    want = torch.softmax(sub, dim=-1)
    for isa in paths():
        kept = torch.full((n, vocab), -1.0)
        sample.sample_rows(logits, torch.arange(n), t, k, p, m, u, isa, kept=kept)
        assert torch.equal(kept > 0, want > 0), f"path {isa}"
        assert torch.allclose(kept / kept.sum(-1, keepdim=True), want, rtol=1e-5, atol=1e-7)


def chi_square_bound(df: int, z: float = 3.719) -> float:
    """The chi-square value a fair draw exceeds with probability ~1e-4 (Wilson-Hilferty)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("t,k,p,m", [(1.0, 0, 1.0, 0.0), (0.7, 0, 0.9, 0.0), (1.3, 6, 1.0, 0.0), (0.8, 7, 0.95, 0.02)])
def test_draws_follow_the_distribution(t, k, p, m):
    """40,000 draws of one row against its truncated softmax (chi-square at ~1e-4), the masked token
    never drawn."""
    vocab, n = 10, 40000
    logits = torch.tensor([[0.3, -1.2, 2.0, 0.0, float("-inf"), 1.1, -0.4, 0.9, -2.5, 1.6]])
    gen = torch.Generator().manual_seed(7)
    u = torch.rand(n, generator=gen, dtype=torch.float64)
    tt, kk, pp, mm = torch.full((n,), t), torch.full((n,), k), torch.full((n,), p), torch.full((n,), m)
    probs = torch.softmax(truncate(logits / t, [k], [p], [m]), dim=-1)[0].double()
    for isa in paths():
        tokens = sample.sample_rows(logits, torch.zeros(n, dtype=torch.long), tt, kk, pp, mm, u, isa)
        counts = torch.bincount(tokens, minlength=vocab).double()
        assert counts[probs == 0].sum() == 0
        live = probs > 0
        expected = probs[live] * n
        chi2 = ((counts[live] - expected) ** 2 / expected).sum().item()
        assert chi2 < chi_square_bound(int(live.sum()) - 1), f"isa {isa}: chi2 {chi2:.1f}"


def test_a_row_is_the_same_alone_in_a_batch_by_index_and_on_any_threads():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(16, 2 * 5000, generator=gen)[:, ::2].contiguous()  # and strided rows below
    wide = torch.randn(16, 2, 5000, generator=gen)
    wide[:, 0] = logits
    t, k, p, m = settings(16, gen, 5000)
    u = torch.rand(16, generator=gen, dtype=torch.float64)
    together = sample.sample_rows(logits, torch.arange(16), t, k, p, m, u)
    for i in range(16):
        one = slice(i, i + 1)
        assert (
            sample.sample_rows(logits, torch.tensor([i]), t[one], k[one], p[one], m[one], u[one]).item() == together[i]
        )
    reverse = torch.arange(15, -1, -1)
    by_index = sample.sample_rows(wide[:, 0], reverse, t.flip(0), k.flip(0), p.flip(0), m.flip(0), u.flip(0))
    assert by_index.flip(0).tolist() == together.tolist()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert sample.sample_rows(logits, torch.arange(16), t, k, p, m, u).tolist() == together.tolist()
    finally:
        torch.set_num_threads(threads)


def test_nan_inf_and_fully_masked_rows_answer_as_argmax():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    logits[0, 7], logits[0, 9] = math.nan, math.nan
    logits[1] = float("-inf")
    logits[2, 11], logits[2, 30] = math.inf, math.inf
    one = torch.ones(4)
    got = sample.sample_rows(
        logits,
        torch.arange(4),
        one,
        torch.zeros(4, dtype=torch.long),
        one,
        torch.zeros(4),
        torch.full((4,), 0.5, dtype=torch.float64),
    )
    assert got[:3].tolist() == [7, 0, 11]


@pytest.mark.parametrize("bad", ["temperature", "u", "top_p", "row"])
def test_bad_arguments_are_refused(bad):
    logits = torch.randn(2, 10)
    args = dict(
        rows=torch.arange(2),
        temperature=torch.ones(2),
        top_k=torch.zeros(2, dtype=torch.long),
        top_p=torch.ones(2),
        min_p=torch.zeros(2),
        u=torch.full((2,), 0.5, dtype=torch.float64),
    )
    if bad == "temperature":
        args["temperature"] = torch.tensor([1.0, 0.0])
    elif bad == "u":
        args["u"] = torch.tensor([0.2, 1.0], dtype=torch.float64)
    elif bad == "top_p":
        args["top_p"] = torch.tensor([1.0, 1.5])
    else:
        args["rows"] = torch.tensor([0, 2])
    with pytest.raises(RuntimeError, match="sample: "):
        sample.sample_rows(logits, **args)


def test_logprobs_equal_log_softmax_with_ranks_and_the_top_n_at_ties():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(10, 5000, generator=gen) * 4
    logits[3] = torch.randint(-2, 2, (5000,), generator=gen).float()  # ties everywhere
    logits[4, ::3] = float("-inf")
    chosen = torch.randint(0, 5000, (10,), generator=gen)
    chosen[4] = 1
    rows = torch.arange(10)
    want = torch.log_softmax(logits, dim=-1)
    order = want.sort(dim=-1, descending=True, stable=True)
    for isa in paths():
        lp, rank, vals, ids = sample.logprob_rows(logits, rows, chosen, 7, isa)
        assert torch.allclose(lp, want[rows, chosen], rtol=1e-5, atol=1e-5)
        assert rank.tolist() == ((want > want[rows, chosen][:, None]).sum(-1) + 1).tolist()
        assert ids.tolist() == order.indices[:, :7].tolist()
        assert torch.allclose(vals, order.values[:, :7], rtol=1e-5, atol=1e-5)
    lp, rank, vals, ids = sample.logprob_rows(logits, rows, chosen, 0)
    assert vals.shape == (10, 0) and ids.shape == (10, 0)
