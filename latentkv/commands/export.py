"""`latentkv export --gguf FOLDER OUT.gguf`: a DeepSeek-family folder (ours or DeepSeek's) as a GGUF
file for llama.cpp / Ollama (latentkv/export/)."""

from __future__ import annotations

import argparse
import sys

from latentkv.config import ConfigError
from latentkv.export.gguf_check import ExportError
from latentkv.export.gguf_writer import OUTTYPE_CHOICES, export_gguf
from latentkv.model.shards import CheckpointError


def register(subparsers) -> None:
    """Add the export subcommand."""
    p = subparsers.add_parser(
        "export",
        help="write an MLA folder as a GGUF file for llama.cpp / Ollama",
        description="Write a deepseek_v2 / deepseek_v3 folder (e.g. a `latentkv convert "
        "--stock` output) as a llama.cpp deepseek2 GGUF. See docs/export.md.",
    )
    p.add_argument(
        "--gguf",
        nargs=2,
        required=True,
        metavar=("FOLDER", "OUT.gguf"),
        help="the Hugging Face folder and the GGUF file to write",
    )
    p.add_argument(
        "--outtype",
        default="auto",
        choices=OUTTYPE_CHOICES,
        help="tensor type: f32 / f16 / bf16 keep the values, q8_0 / q4_0 / q4_1 quantize the linear "
        "weights (norms, router and attn_k_b / attn_v_b stay float); auto: the folder's dtype",
    )
    p.add_argument(
        "--tokenizer-pre",
        default=None,
        metavar="NAME",
        help="llama.cpp's pre-tokenizer name (tokenizer.ggml.pre), when it is not detected "
        "(e.g. llama-bpe, qwen2, smollm)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    folder, out = args.gguf
    try:
        written = export_gguf(folder, out, args.outtype, tokenizer_pre=args.tokenizer_pre)
    except (ExportError, CheckpointError, ConfigError, OSError) as err:  # OSError: e.g. no room for OUT
        print(f"latentkv export: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {written}")
    return 0
