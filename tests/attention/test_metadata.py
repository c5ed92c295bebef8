"""Flat-batch metadata: block runs and per-group attention for mixed query lengths."""

import pytest
import torch

from latentkv.attention.metadata import build_metadata, decode_metadata, general_metadata


def row_list(rows) -> list[int]:
    """A group's flat rows (a slice where consecutive, else an index tensor) as a list."""
    return torch.arange(1 << 12)[rows].tolist()


def test_mixed_lengths_attend_per_group_and_equal_lengths_do_not():
    # sequence 0 prefills 5 tokens, 1 and 2 decode one each, 3 prefills 3
    batch, positions = build_metadata([5, 1, 1, 3], [5, 9, 17, 7], [[0, 1], [2, 3, 4], [5, 6, 7, 8, 9], [10, 11]], 4)
    assert positions.tolist() == [0, 1, 2, 3, 4, 8, 16, 4, 5, 6]
    groups = [(row_list(rows), sub.num_seqs, sub.max_query_len, sub.max_context_len) for rows, sub in batch.groups]
    assert groups == [([0, 1, 2, 3, 4], 1, 5, 5), ([7, 8, 9], 1, 3, 7), ([5, 6], 2, 1, 17)]
    assert all(sub.groups is None for _, sub in batch.groups)
    same, _ = build_metadata([2, 2], [4, 6], [[0], [1, 2]], 4)
    assert same.groups is None
    decode, _ = build_metadata([1, 1], [4, 6], [[0], [1, 2]], 4)
    assert decode.groups is None


def same_metadata(a, b) -> bool:
    """Every field of two AttentionMetadata equal (tensors: values and dtypes), groups recursively."""
    for name in (
        "query_start",
        "context_lens",
        "block_tables",
        "slot_mapping",
        "query_index",
        "query_valid",
        "query_pos",
    ):
        x, y = getattr(a, name), getattr(b, name)
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
            return False
    scalars = ("max_query_len", "max_context_len", "path", "runs", "invariant", "prompt_rows")
    if any(getattr(a, n) != getattr(b, n) for n in scalars) or (a.groups is None) != (b.groups is None):
        return False
    return a.groups is None or all(
        row_list(ra) == row_list(rb) and same_metadata(ga, gb)
        for (ra, ga), (rb, gb) in zip(a.groups, b.groups, strict=True)
    )


def test_the_decode_fast_path_builds_what_the_general_path_builds():
    """Single-token steps skip the general path's tensor ops: every field must come out equal —
    one sequence or several, lengths ending mid-block and on a block edge, out-of-order and
    spare blocks, invariant mode with and without prompt rows, split on and off."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(40):
        b = 1 + trial % 6
        ctx = torch.randint(1, 70, (b,), generator=gen).tolist()
        if trial % 5 == 0:
            ctx[0] = 32  # ends exactly on a block edge
        tables = [torch.randperm(64, generator=gen)[: -(-c // 16) + trial % 2].tolist() for c in ctx]
        prompt = [c - int(torch.randint(0, 3, (1,), generator=gen)) + 1 for c in ctx]  # some rows still prompt
        for invariant, prompt_lens, split in (
            (False, None, True),
            (True, None, True),
            (True, prompt, True),
            (True, prompt, False),
        ):
            args = ([1] * b, ctx, tables, 16, "cpu", "auto", split, invariant, prompt_lens)
            fast, fast_pos = decode_metadata(*args[1:])
            slow, slow_pos = general_metadata(*args)
            assert torch.equal(fast_pos, slow_pos) and fast_pos.dtype == slow_pos.dtype
            assert same_metadata(fast, slow), (trial, invariant, split)
    with pytest.raises(ValueError, match="blocks"):
        build_metadata([1], [40], [[0, 1]], 16)


def test_consecutive_rows_are_a_slice_and_scattered_ones_an_index():
    # decodes between two prefills: their rows (5, 6) are consecutive; between decodes, not
    batch, _ = build_metadata([5, 1, 1, 3], [5, 9, 17, 7], [[0, 1], [2, 3, 4], [5, 6, 7, 8, 9], [10, 11]], 4)
    assert [rows for rows, _ in batch.groups] == [slice(0, 5), slice(7, 10), slice(5, 7)]
    split, _ = build_metadata([1, 5, 1], [9, 5, 17], [[2, 3, 4], [0, 1], [5, 6, 7, 8, 9]], 4)
    (prefill, _), (decodes, _) = split.groups
    assert prefill == slice(1, 6) and isinstance(decodes, torch.Tensor) and decodes.tolist() == [0, 6]
