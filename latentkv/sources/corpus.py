"""Calibration and held-out text: built offline, or read from the user's files.

Calibration also takes chat conversations (chat_data.calibration_examples: the chat prompts'
calibration split with answers) rendered through the source's own chat template, control
tokens included — the use the converted model is for.

The default corpus is text every Python installation has: the language reference
topics that `pydoc` ships (`pydoc_data.topics`) and the docstrings of the standard
library's modules. Each document goes to the held-out part or the calibration part
by a hash of its name, so the split is fixed and the held-out text is never used
for calibration.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import sysconfig
from pathlib import Path

import torch

from latentkv.sources import chat_data

HELDOUT_EVERY = 8  # one document in eight (by name hash) is held out
MIN_DOC_CHARS = 400
SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "ensurepip", "turtledemo"}


def pydoc_documents() -> list[tuple[str, str]]:
    """(name, text) of the reference topics pydoc ships."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip it
        return []
    return [(f"topic:{k}", v) for k, v in sorted(topics.items()) if len(v) >= MIN_DOC_CHARS]


def module_docstrings(path: Path) -> str:
    """The module, class and function docstrings of one source file, joined."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return ""
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    docs = [ast.get_docstring(n) for n in nodes]
    return "\n\n".join(d for d in docs if d and len(d) > 80)


@functools.lru_cache(maxsize=1)
def docstring_documents() -> tuple[tuple[str, str], ...]:
    """(name, text) of each standard-library module's docstrings (parsed once per process)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS & set(rel.parts):
            continue
        text = module_docstrings(path)
        if len(text) >= MIN_DOC_CHARS:
            docs.append((f"module:{rel.as_posix()}", text))
    return tuple(docs)


def is_heldout(name: str) -> bool:
    """Whether a default-corpus document belongs to the held-out split (fixed by its name)."""
    return int(hashlib.sha1(name.encode()).hexdigest(), 16) % HELDOUT_EVERY == 0


@functools.lru_cache(maxsize=2)
def default_documents(heldout: bool) -> tuple[str, ...]:
    """Texts of the default corpus: the held-out split or the calibration split."""
    docs = pydoc_documents() + list(docstring_documents())
    return tuple(text for name, text in docs if is_heldout(name) == heldout)


def heldout_text() -> str:
    """The default held-out text (for perplexity), one string."""
    return "\n\n".join(default_documents(heldout=True))


def file_documents(paths: list[str | Path]) -> list[str]:
    """Texts of user files: .jsonl (one JSON object per line with a "text" field) or plain text."""
    docs = []
    for path in map(Path, paths):
        if not path.is_file():
            raise FileNotFoundError(f"calibration file not found: {path}")
        if path.suffix == ".jsonl":
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    record = json.loads(line)
                    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                        raise ValueError(f'{path}:{n}: each jsonl line needs a string "text" field')
                    docs.append(record["text"])
        else:
            docs.append(path.read_text(encoding="utf-8"))
    return docs


def token_windows(tokenizer, docs: list[str], ctx: int, max_tokens: int | None = None, seed: int = 0) -> torch.Tensor:
    """Non-overlapping windows [N, ctx] of the documents' tokens, in a seeded random order.

    Documents are shuffled (fixed seed) and concatenated with blank lines; tokenizing
    stops once enough text for max_tokens (plus margin) is gathered.
    """
    order = torch.randperm(len(docs), generator=torch.Generator().manual_seed(seed)).tolist()
    ids: list[int] = []
    for i in order:
        ids.extend(tokenizer.encode(docs[i] + "\n\n", add_special_tokens=False))
        if max_tokens is not None and len(ids) >= max_tokens + ctx:
            break
    n = len(ids) // ctx
    if max_tokens is not None:
        n = min(n, max(1, max_tokens // ctx))
    if n == 0:
        raise ValueError(f"not enough text for one window of {ctx} tokens ({len(ids)} tokens)")
    return torch.tensor(ids[: n * ctx]).view(n, ctx)


def chat_windows(tokenizer, n: int, ctx: int, seed: int = 0) -> torch.Tensor:
    """Up to n windows [n', ctx] of chat conversations (calibration split) rendered through the
    tokenizer's chat template, in a seeded order, concatenated; [0, ctx] if it has no template.
    n' < n when the conversations run out (no conversation is used twice)."""
    return marked_chat_windows(tokenizer, n, ctx, seed)[0]


def marked_chat_windows(tokenizer, n: int, ctx: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(chat_windows' windows [n', ctx], emphasis [n', ctx] bool): the positions of the assistant's
    answers (its end-of-turn token included) and of the template's control tokens (the tokenizer's
    special tokens) — what the converted model is used for and what every turn attends to."""
    if n <= 0 or not getattr(tokenizer, "chat_template", None):
        return torch.zeros(0, ctx, dtype=torch.long), torch.zeros(0, ctx, dtype=torch.bool)
    examples = chat_data.calibration_examples()
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
    ids: list[int] = []
    marked: list[bool] = []
    for i in order:
        conversation, answer_start = chat_data.render_chat_example(tokenizer, examples[i])
        ids += conversation
        marked += [k >= answer_start for k in range(len(conversation))]
        if len(ids) >= n * ctx:
            break
    n = min(n, len(ids) // ctx)
    ids_t = torch.tensor(ids[: n * ctx], dtype=torch.long).view(n, ctx)
    control = torch.isin(ids_t, torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long))
    return ids_t, torch.tensor(marked[: n * ctx], dtype=torch.bool).view(n, ctx) | control
