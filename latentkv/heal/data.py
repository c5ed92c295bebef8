"""Training windows for healing, in an order fixed by the seed and the step number,
so a resumed run sees exactly the batches an uninterrupted one would."""
from __future__ import annotations

from pathlib import Path

import torch

from ..convert.corpus import default_documents, file_documents, token_windows


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


def training_windows(tokenizer, data: list[str] | None, seq_len: int, max_tokens: int | None, seed: int) -> torch.Tensor:
    """[N, seq_len] token windows: the user's files, or the default corpus's training split
    (its held-out split is never trained on)."""
    docs = file_documents(expand_paths(data)) if data else list(default_documents(heldout=False))
    return token_windows(tokenizer, docs, seq_len, max_tokens, seed)


def batch_indices(step: int, batch: int, num_windows: int, seed: int) -> torch.Tensor:
    """Window ids of one step: epoch-wise permutations seeded by (seed, epoch)."""
    ids = []
    for k in range(step * batch, (step + 1) * batch):
        epoch, pos = divmod(k, num_windows)
        perm = torch.randperm(num_windows, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        ids.append(int(perm[pos]))
    return torch.tensor(ids)
