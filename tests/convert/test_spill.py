"""Calibration with its activations and statistics on disk gives the in-memory numbers."""

from __future__ import annotations

import torch

from latentkv.convert import spill
from latentkv.convert.calibrate import collect_stats

from latentkv.sources.readers import read_source

import llama_tiny


def test_spilled_calibration_equals_the_in_memory_one(tmp_path):
    llama_tiny.save("qwen2_bias", tmp_path / "src")
    src = read_source(tmp_path / "src")
    ids = torch.randint(0, llama_tiny.VOCAB, (5, 24), generator=torch.Generator().manual_seed(3))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    held = collect_stats(src, ids, batch=2)
    old = spill.BUDGET
    try:
        spill.BUDGET = 0  # everything past the budget: on disk
        spilled = collect_stats(
            src, ids, batch=2, store=spill.batch_store(scratch, 1), keep=spill.stats_keeper(scratch, 1)
        )
    finally:
        spill.BUDGET = old
    assert all(isinstance(st, spill.SpilledStats) for st in spilled)
    for a, b in zip(held, spilled):
        for name in ("xx", "dist", "rho", "kappa"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert a.tokens == b.tokens
    # what stays on disk: one xx file per layer; the activation batches went with their layers
    assert len(list(scratch.iterdir())) == src.num_layers


def test_disk_batches_round_trip_and_clean_up(tmp_path):
    batches = spill.DiskBatches(tmp_path)
    tensors = [torch.randn(2, 3, 4), torch.randn(1, 3, 4).double(), torch.randn(3, 3, 4).bfloat16()]
    for t in tensors:
        batches.append(t)
    assert len(batches) == 3 and len(list(tmp_path.iterdir())) == 3
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(batches, tensors))
    assert all(torch.equal(a, b) for a, b in zip(batches, tensors))  # iterable again
    del batches
    assert list(tmp_path.iterdir()) == []


def test_within_the_budget_nothing_goes_to_disk(tmp_path):
    assert spill.batch_store(tmp_path, spill.BUDGET) is list
    st = object()
    assert spill.stats_keeper(tmp_path, spill.BUDGET)(st) is st
    assert spill.batch_store(None, spill.BUDGET + 1) is list
