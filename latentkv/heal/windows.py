"""Training windows for healing, in an order fixed by the seed and the step number,
so a resumed run sees exactly the batches an uninterrupted one would.

The default mix: documentation windows (the default corpus's training split, or the user's
files) and chat windows — the chat data's *calib* split (the original model's own answers)
rendered through the chat template, control tokens included, packed back to back. The chat
data's held-out split, which `eval chat` measures on, is never trained on."""

from __future__ import annotations

from pathlib import Path

import torch

from ..sources.chat_data import load_chat, render_chat_example
from ..sources.corpus import default_documents, file_documents, token_windows


def expand_paths(paths: list[str | Path]) -> list[Path]:
    """Files as given; folders become their .txt / .jsonl / .md files, sorted."""
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.suffix in (".txt", ".jsonl", ".md") and p.is_file())
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"training data not found: {path}")
    if not files:
        raise ValueError(f"no .txt/.jsonl/.md files in {', '.join(map(str, paths))}")
    return files


def training_windows(
    tokenizer,
    data: list[str] | None,
    seq_len: int,
    max_tokens: int | None,
    seed: int,
    chat: list | None = None,
    chat_share: float = 0.0,
) -> torch.Tensor:
    """[N, seq_len] token windows: chat windows (a `chat_share` of the token budget, from the
    chat examples `chat`) then document windows (the user's files, or the default corpus's
    training split: its held-out split is never trained on); batch_indices shuffles them."""
    docs = file_documents(expand_paths(data)) if data else list(default_documents(heldout=False))
    if not chat or chat_share <= 0:
        return token_windows(tokenizer, docs, seq_len, max_tokens, seed)
    budget = max_tokens if max_tokens is not None else 1_000_000
    n_chat = max(1, round(budget * chat_share) // seq_len)
    chat_part = chat_windows(tokenizer, chat, seq_len, n_chat, seed)
    if chat_share >= 1:
        return chat_part
    return torch.cat(
        [chat_part, token_windows(tokenizer, docs, seq_len, max(seq_len, budget - n_chat * seq_len), seed)]
    )


def chat_windows(tokenizer, examples: list, seq_len: int, n_windows: int, seed: int) -> torch.Tensor:
    """[n_windows, seq_len]: the rendered conversations packed back to back, in a seeded order
    that changes each pass (so repeated passes make different windows)."""
    convs = [render_chat_example(tokenizer, ex)[0] for ex in examples]
    if not convs:
        raise ValueError("no chat examples to train on")
    ids: list[int] = []
    for rep in range(n_windows * seq_len // max(1, sum(map(len, convs))) + 2):
        for i in torch.randperm(len(convs), generator=torch.Generator().manual_seed(seed * 7919 + rep)).tolist():
            ids.extend(convs[i])
        if len(ids) >= n_windows * seq_len:
            break
    return torch.tensor(ids[: n_windows * seq_len]).view(n_windows, seq_len)


def calib_chat(teacher) -> list:
    """The chat examples healing may train on: the calib split, the teacher's own answers."""
    return load_chat(teacher, "calib")


def batch_indices(step: int, batch: int, num_windows: int, seed: int) -> torch.Tensor:
    """Window ids of one step: epoch-wise permutations seeded by (seed, epoch)."""
    ids = []
    for k in range(step * batch, (step + 1) * batch):
        epoch, pos = divmod(k, num_windows)
        perm = torch.randperm(num_windows, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        ids.append(int(perm[pos]))
    return torch.tensor(ids)
