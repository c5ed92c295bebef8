"""Options every `latentkv bench` command shares: the threads each system runs on."""

from __future__ import annotations

import argparse
import os

import torch

from latentkv import cpu


def add_threads_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads", type=int, default=2, help="threads for every system (torch, OpenMP, llama.cpp; default 2)"
    )


def set_threads(args) -> None:
    """Every system of the run on the same threads: torch and the native kernel's OpenMP team
    (engines read LATENTKV_THREADS), llama.cpp (systems.py reads torch's)."""
    if args.threads < 1:
        raise SystemExit(f"--threads {args.threads}: expected a positive number")
    os.environ["LATENTKV_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    # figures depend on the CPU's instruction set (bf16 is 100x slower without avx512_bf16/AMX)
    print(f"latentkv bench: CPU flags {cpu.describe()}; {args.threads} threads", flush=True)
