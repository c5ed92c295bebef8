"""The batched sampler (engine/sampler.py): greedy, seeded rows, truncation, penalties, logprobs."""

import math

import pytest
import torch

from latentkv.engine.sampler import apply_penalties, finite_rows, first_argmax, sample, truncate
from latentkv.engine.sequence import Sequence
from latentkv.kernels import sample as sample_kernel
from latentkv.sampling_params import SamplingParams


def seq(params, prompt=(1, 2, 3), outputs=()):
    s = Sequence("r", list(prompt), params)
    for t in outputs:
        s.append_token(t)
    return s


def test_greedy_and_top_k_1_agree():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    greedy = [seq(SamplingParams(temperature=0)) for _ in range(6)]
    top1 = [seq(SamplingParams(temperature=1.3, top_k=1)) for _ in range(6)]
    a = sample(logits, greedy, []).token_ids
    b = sample(logits, top1, [], torch.Generator().manual_seed(1)).token_ids
    assert a == logits.argmax(-1).tolist() == b


def test_first_argmax_is_argmax_with_ties_nan_and_inf():
    """The greedy choice takes max(dim).indices for speed: the same index as argmax, the first of
    tied maxima, NaN as the largest."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        x = torch.randint(0, 4, (8, 4099), generator=gen).float()  # many ties
        if trial % 2:
            x[0, 1234], x[1, 7], x[1, 9], x[2, 100], x[3, 5] = math.nan, math.inf, math.inf, -math.inf, math.nan
            x[3, 2] = math.nan
        assert torch.equal(first_argmax(x), x.argmax(dim=-1))


def test_finite_rows_flags_any_nan_or_inf():
    x = torch.randn(6, 1000, generator=torch.Generator().manual_seed(0)) * 1e4
    x[1, 3], x[2, 999], x[3, 0], x[4, 5], x[4, 6] = math.nan, math.inf, -math.inf, math.inf, -math.inf
    x[5] = 3e38  # the largest finite values: their row sum must not overflow into a false alarm
    assert finite_rows(x) == [True, False, False, False, False, True]


def test_seeded_rows_independent_of_batch():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 40, generator=gen)
    draws_alone, draws_batched = [], []
    s_alone = seq(SamplingParams(temperature=1.0, seed=7))
    s_batched = seq(SamplingParams(temperature=1.0, seed=7))
    others = [seq(SamplingParams(temperature=1.0)) for _ in range(4)]
    for _ in range(20):
        draws_alone.append(sample(logits[2:3], [s_alone], [], gen).token_ids[0])
        batch = others[:2] + [s_batched] + others[2:]
        draws_batched.append(sample(logits, batch, [], gen).token_ids[2])
    assert draws_alone == draws_batched
    assert len(set(draws_alone)) > 1  # it really samples


def test_sampling_matches_distribution():
    logits = torch.tensor([[0.0, math.log(3.0), -1e9, math.log(6.0)]]).repeat(4000, 1)
    seqs = [seq(SamplingParams(temperature=1.0)) for _ in range(4000)]
    tokens = torch.tensor(sample(logits, seqs, [], torch.Generator().manual_seed(3)).token_ids)
    freq = torch.bincount(tokens, minlength=4).float() / len(tokens)
    assert freq[2] == 0
    assert torch.allclose(freq, torch.tensor([0.1, 0.3, 0.0, 0.6]), atol=0.03)


def test_truncation_top_k_top_p_min_p():
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.1]])
    logits = probs.log()

    def kept(x):
        return (x > float("-inf")).squeeze(0).tolist()

    assert kept(truncate(logits, [2], [1.0], [0.0])) == [True, True, False, False]
    # nucleus 0.7: 0.5 + 0.25 reaches it, so the third is dropped
    assert kept(truncate(logits, [0], [0.7], [0.0])) == [True, True, False, False]
    assert kept(truncate(logits, [0], [0.8], [0.0])) == [True, True, True, False]
    # min_p 0.4: floor 0.2
    assert kept(truncate(logits, [0], [1.0], [0.4])) == [True, True, False, False]


def test_penalties():
    logits = torch.tensor([[2.0, 2.0, -1.0, 1.9]])
    # token 0 in the prompt, token 1 twice in the output
    s = seq(SamplingParams(temperature=0, repetition_penalty=2.0), prompt=(0,), outputs=(1, 1))
    assert sample(logits, [s], []).token_ids == [3]
    s = seq(SamplingParams(temperature=0, frequency_penalty=0.1), prompt=(0,), outputs=(1, 1))
    # token 1: 2.0 - 0.2 = 1.8 < token 0's 2.0 (the prompt is not frequency-penalised)
    assert sample(logits, [s], []).token_ids == [0]
    s = seq(SamplingParams(temperature=0, presence_penalty=0.15), prompt=(3,), outputs=(0, 1))
    assert sample(logits, [s], []).token_ids == [3]


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0]])
    s = seq(SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[1]), outputs=(2,))
    assert sample(logits, [s], eos_token_ids=[0]).token_ids == [2]
    s = seq(SamplingParams(temperature=0, min_tokens=1), outputs=(2,))
    assert sample(logits, [s], eos_token_ids=[0]).token_ids == [0]


def test_logprobs_include_chosen_and_top_n():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    s = seq(SamplingParams(temperature=0, logprobs=2, presence_penalty=2.0), prompt=(5,), outputs=(1,))
    out = sample(logits, [s], [])
    lp = torch.log_softmax(logits, -1)[0]
    assert out.token_ids == [2]  # token 1 penalised 3 -> 1
    d = out.logprobs[0]
    assert set(d) == {1, 2}
    assert d[1].rank == 1 and d[2].rank == 2
    assert d[2].logprob == pytest.approx(lp[2].item())  # raw, before penalties
    s = seq(SamplingParams(temperature=0, logprobs=1, repetition_penalty=100.0), prompt=(1, 2))
    out = sample(logits, [s], [])
    assert out.token_ids == [0] and set(out.logprobs[0]) == {1, 0} and out.logprobs[0][0].rank == 3


def mixed_batch(n, vocab, gen):
    """Greedy, seeded and unseeded rows under every kind of truncation."""
    seqs = []
    for i in range(n):
        params = [
            SamplingParams(temperature=0),
            SamplingParams(temperature=1.0),
            SamplingParams(temperature=0.7, top_p=0.9),
            SamplingParams(temperature=0.8, top_k=40, seed=i),
            SamplingParams(temperature=1.2, min_p=0.05, top_p=0.95, top_k=vocab + 3),
        ][i % 5]
        seqs.append(seq(params))
    return seqs


def test_native_and_torch_samplers_pick_the_same_tokens(monkeypatch):
    """The kernel and the reference ops draw the same uniforms and so pick the same tokens."""
    if not sample_kernel.available():
        pytest.skip(f"native sampler not built: {sample_kernel.unavailable_reason()}")
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(20, 3000, generator=gen) * 3
    native = sample(logits, mixed_batch(20, 3000, gen), [], torch.Generator().manual_seed(5)).token_ids
    monkeypatch.setattr(sample_kernel.EXT, "state", {"module": None, "reason": "the reference path (tests)"})
    reference = sample(logits, mixed_batch(20, 3000, gen), [], torch.Generator().manual_seed(5)).token_ids
    assert native == reference
    assert len(set(native)) > 10  # it really samples


def dense_penalties(logits, seqs):
    """The [N, vocab] count-table form of the penalties (what the sparse form must equal bit for bit)."""
    n, vocab = logits.shape

    def counts(lists):
        out = torch.zeros(n, vocab)
        for i, ids in enumerate(lists):
            for t in ids:
                if t < vocab:
                    out[i, t] += 1
        return out

    c = counts([s.output_token_ids for s in seqs])
    seen = (c + counts([s.prompt_token_ids for s in seqs])) > 0
    r = torch.tensor([s.params.repetition_penalty for s in seqs])[:, None].expand_as(logits)
    logits = torch.where(seen, torch.where(logits > 0, logits / r, logits * r), logits)
    logits = logits - torch.tensor([s.params.frequency_penalty for s in seqs])[:, None] * c
    return logits - torch.tensor([s.params.presence_penalty for s in seqs])[:, None] * (c > 0).float()


@pytest.mark.parametrize("path", ["native", "torch"])
def test_sparse_penalties_equal_the_dense_table(path, monkeypatch):
    if path == "native" and not sample_kernel.available():
        pytest.skip(f"native sampler not built: {sample_kernel.unavailable_reason()}")
    if path == "torch":
        monkeypatch.setattr(sample_kernel.EXT, "state", {"module": None, "reason": "the reference path (tests)"})
    gen = torch.Generator().manual_seed(2)
    vocab = 300
    logits = torch.randn(6, vocab, generator=gen) * 2
    options = [
        dict(repetition_penalty=1.3),
        dict(presence_penalty=0.5, frequency_penalty=-0.3),
        dict(repetition_penalty=0.8, frequency_penalty=1.0),
        dict(),
        dict(presence_penalty=-1.5),
        dict(repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.2),
    ]
    seqs = [
        seq(
            SamplingParams(temperature=1.0, **o),
            prompt=torch.randint(0, vocab, (30,), generator=gen).tolist(),
            outputs=torch.randint(0, vocab, (i * 7,), generator=gen).tolist(),
        )
        for i, o in enumerate(options)
    ]
    seqs[0].token_ids[3] = vocab + 4  # an id past the logits (a tokenizer larger than the head) is passed over
    before = logits.clone()
    assert torch.equal(apply_penalties(logits, seqs), dense_penalties(logits, seqs))
    assert torch.equal(logits, before)  # a copy: the caller's logits stay as they were


def test_settings_at_the_edges_of_float32_sample():
    """Valid requests whose settings float32 cannot hold (top_p 5e-324, a temperature past 3.4e38)
    still sample: the tiny top_p keeps the top token, the huge temperature draws near-uniformly."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    seqs = [
        seq(SamplingParams(temperature=1.0, top_p=5e-324)),
        seq(SamplingParams(temperature=1e300)),
        seq(SamplingParams(temperature=0.5, min_p=1e-50)),
    ]
    out = sample(logits, seqs, [], torch.Generator().manual_seed(1)).token_ids
    assert out[0] == int(logits[0].argmax()) and 0 <= out[1] < 50 and 0 <= out[2] < 50
