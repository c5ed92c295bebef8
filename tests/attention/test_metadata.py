"""Flat-batch metadata: block runs and per-group attention for mixed query lengths."""
import torch

from latentkv.attention.metadata import build_metadata


def test_mixed_lengths_attend_per_group_and_equal_lengths_do_not():
    # sequence 0 prefills 5 tokens, 1 and 2 decode one each, 3 prefills 3
    batch, positions = build_metadata([5, 1, 1, 3], [5, 9, 17, 7], [[0, 1], [2, 3, 4], [5, 6, 7, 8, 9], [10, 11]], 4)
    assert positions.tolist() == [0, 1, 2, 3, 4, 8, 16, 4, 5, 6]
    groups = [(rows.tolist(), sub.num_seqs, sub.max_query_len, sub.max_context_len) for rows, sub in batch.groups]
    assert groups == [([0, 1, 2, 3, 4], 1, 5, 5), ([7, 8, 9], 1, 3, 7), ([5, 6], 2, 1, 17)]
    assert all(sub.groups is None for _, sub in batch.groups)
    same, _ = build_metadata([2, 2], [4, 6], [[0], [1, 2]], 4)
    assert same.groups is None
    decode, _ = build_metadata([1, 1], [4, 6], [[0], [1, 2]], 4)
    assert decode.groups is None
