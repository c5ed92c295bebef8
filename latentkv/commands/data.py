"""`latentkv data chat [SOURCE] [--out FILE] [--max-tokens N]`: the source model's own greedy
answers to the chat prompts (sources/chat_data.py), for calibration, `eval chat` and healing."""

from __future__ import annotations

import argparse
import sys

from latentkv.sources import chat_data
from latentkv.sources.readers import SourceError


def register(subparsers) -> None:
    p = subparsers.add_parser("data", help="data sets made from a model (chat answers)")
    sub = p.add_subparsers(dest="data_command", metavar="WHAT")
    chat = sub.add_parser(
        "chat", help="let the original model answer the chat prompts greedily (float32) and write JSONL"
    )
    chat.add_argument(
        "source",
        nargs="?",
        default=None,
        help="a .gguf, a Llama-family HF folder or an MLA folder; default: the bundled SmolLM2",
    )
    chat.add_argument(
        "--out",
        default=None,
        help="answer file to write (default: find the bundled or cached one, generating it if none matches)",
    )
    chat.add_argument(
        "--max-tokens",
        type=int,
        default=chat_data.MAX_NEW_TOKENS,
        help=f"new tokens per answer at most (default {chat_data.MAX_NEW_TOKENS})",
    )
    chat.set_defaults(func=run_chat)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run_chat(args: argparse.Namespace) -> int:
    if args.max_tokens < 1:
        print("latentkv data chat: --max-tokens must be at least 1", file=sys.stderr)
        return 2
    try:
        source = chat_data.source_path(args.source)
        if not source.exists():
            raise SourceError(f"source not found: {source}")
        if args.out:
            path = chat_data.write_answers(source, args.out, args.max_tokens)
        else:
            path = chat_data.answers_file(source, args.max_tokens)
    except (SourceError, ValueError, OSError) as err:
        print(f"latentkv data chat: error: {err}", file=sys.stderr)
        return 2
    header, rows = chat_data.read_answers(path)
    done = sum(r["finished"] for r in rows)
    print(
        f"{path}: {len(rows)} answers of {header['source']} (fingerprint {header['fingerprint'][:16]}, "
        f"{header['generator']}, greedy float32, ≤ {header['max_new_tokens']} tokens; {done} ended by the model)"
    )
    return 0
