"""The perplexity protocol: non-overlapping windows, first token of each not predicted."""

from __future__ import annotations

import math

import pytest
import torch

from latentkv.eval.perplexity import perplexity, window_ids


def test_uniform_model_has_vocab_perplexity():
    vocab = 37
    windows = window_ids(list(range(30)) * 10, ctx=25)
    r = perplexity(lambda ids: torch.zeros(*ids.shape, vocab), windows)
    assert r["ppl"] == pytest.approx(vocab) and r["tokens"] == windows.shape[0] * 24 and r["ctx"] == 25


def test_perfect_model_and_windowing():
    ids = list(range(50))
    windows = window_ids(ids, ctx=16)
    assert windows.shape == (3, 16) and windows[1, 0].item() == 16  # tail dropped, no overlap

    def oracle(batch):  # puts all mass on the next token
        logits = torch.full((*batch.shape, 64), -1e4)
        logits.scatter_(-1, (batch + 1).clamp(max=63)[..., None], 0.0)
        return logits

    r = perplexity(oracle, windows)
    assert r["ppl"] == pytest.approx(1.0) and math.isclose(r["nll"], 0.0, abs_tol=1e-6)


def test_too_short_text_is_an_error():
    with pytest.raises(ValueError, match="too short"):
        window_ids([1, 2, 3], ctx=8)
