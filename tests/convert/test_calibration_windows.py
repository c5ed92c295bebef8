"""Calibration windows (convert/api.py calibration_windows): chat conversations in the source's own
template, mixed with documents by share, their answers and control tokens weighted."""

from __future__ import annotations

import torch

from latentkv.convert.api import calibration_windows
from latentkv.sources.chat_data import calibration_examples, render_chat_example
from latentkv.sources.corpus import default_documents, marked_chat_windows, token_windows


def test_calibration_mixes_documents_and_chat_by_share(smollm2, smollm2_tokenizer):
    ctx, tokens = 128, 8 * 128
    docs_only, weights = calibration_windows(smollm2, None, tokens, ctx, 0.0)
    assert weights is None
    assert torch.equal(docs_only, token_windows(smollm2_tokenizer, list(default_documents(heldout=False)), ctx, tokens))
    mixed, _ = calibration_windows(smollm2, None, tokens, ctx, 0.25)
    assert mixed.shape == (8, ctx) and torch.equal(mixed[:6], docs_only[:6])
    im_start = smollm2_tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert (mixed[6:] == im_start).any() and not (mixed[:6] == im_start).any()
    assert (calibration_windows(smollm2, None, tokens, ctx, 1.0)[0] == im_start).any(1).all()


def test_calibration_weights_mark_chat_answers_and_control_tokens(smollm2, smollm2_tokenizer):
    """calib_weight: the chat windows' answer and control-token positions weigh it, everything else
    (the documents, the system and user turns) 1; the windows do not change."""
    ctx, tokens = 128, 8 * 128
    plain, _ = calibration_windows(smollm2, None, tokens, ctx, 0.25)
    windows, weights = calibration_windows(smollm2, None, tokens, ctx, 0.25, calib_weight=3.0)
    assert torch.equal(windows, plain) and weights.shape == windows.shape
    assert set(weights.unique().tolist()) == {1.0, 3.0}
    assert (weights[:6] == 1).all()  # documents
    special = torch.tensor(smollm2_tokenizer.all_special_ids)
    assert (weights[6:][torch.isin(windows[6:], special)] == 3).all()  # control tokens
    # the answers: each conversation's text after its last "assistant\n" header is weighted, its user turn is not
    chat, marked = marked_chat_windows(smollm2_tokenizer, 2, ctx)
    assert torch.equal(chat, windows[6:]) and torch.equal(marked, weights[6:] == 3)
    first = calibration_examples()
    order = torch.randperm(len(first), generator=torch.Generator().manual_seed(0)).tolist()
    ids, start = render_chat_example(smollm2_tokenizer, first[order[0]])
    n = min(len(ids), ctx)
    want = torch.tensor([k >= start for k in range(n)]) | torch.isin(torch.tensor(ids[:n]), special)
    assert torch.equal(marked[0, :n], want) and marked[0, :n].any() and not marked[0, :n].all()
