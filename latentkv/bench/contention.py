"""`latentkv bench contention`: batch-1 decode on a quiet machine, then with other processes
keeping --busy-cores cores busy, then quiet again: latentkv with the thread count it chooses
(all cores, backing off while cores are taken: engine/threads.py), latentkv on a fixed count
(--threads), and llama.cpp on --threads when installed.

The "busy" processes are busy loops pinned to the last allowed cores (a compile, another server, a
browser in real use). Each phase: one untimed prefill of the prompt, then `--repeats` decodes of
`--tokens` tokens per system, interleaved; the first decode of a phase is reported apart, as it
holds the engine's reaction (two slow steps to back off, up to two seconds to take a freed core
back)."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

from ..cpu import allowed_cores
from ..plots import new_figure, save_figure
from .isolated import FAILED, attempt, close_all
from .report import median, print_table, write_json
from .systems import LatentKVSystem, llama_cpp_baseline

PHASES = ("quiet", "busy", "quiet again")


@contextmanager
def busy_cores(count: int):
    """`count` busy-loop processes, each pinned to one of the last allowed cores."""
    cores = sorted(allowed_cores())[-count:] if count else []
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"], preexec_fn=lambda c=c: os.sched_setaffinity(0, {c})
        )
        for c in cores
    ]
    try:
        yield cores
    finally:
        for p in procs:
            p.kill()
            p.wait()


@contextmanager
def engine_chooses_threads():
    """The engine governs only a count it chose: hide the bench's LATENTKV_THREADS while it is built."""
    saved = {k: os.environ.pop(k) for k in ("LATENTKV_THREADS", "OMP_NUM_THREADS") if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def build_systems(args, length: int, failed: dict) -> list:
    kw = dict(max_model_len=length, kv_cache_memory="256MiB", quantization=args.weights)
    if args.weights == "none":
        kw.pop("quantization")
    with engine_chooses_threads():
        auto = LatentKVSystem("latentkv (threads: auto)", args.model, "int8", **kw)
    systems = [
        auto,
        LatentKVSystem(f"latentkv ({args.threads} threads)", args.model, "int8", threads=args.threads, **kw),
    ]
    return systems + llama_cpp_baseline(f"llama.cpp ({args.threads} threads)", args.source, n_ctx=length, failed=failed)


def run(args) -> dict:
    cores = len(allowed_cores())
    if not 0 < args.busy_cores < cores:
        raise SystemExit(
            f"--busy-cores {args.busy_cores}: expected 1 .. {cores - 1} (this process may use {cores} cores)"
        )
    prompt_len = args.contexts[0]
    failed: dict[str, str] = {}
    systems = build_systems(args, prompt_len + (args.repeats + 2) * args.tokens + 64, failed)
    vocab = systems[0].engine.cfg.vocab_size
    prompt = torch.randint(3, vocab, (prompt_len,), generator=torch.Generator().manual_seed(prompt_len)).tolist()
    live = [s for s in systems if attempt(s, failed, "prepare", prompt) is not FAILED]
    results: dict[str, dict] = {}
    for phase in PHASES:
        with busy_cores(args.busy_cores if phase == "busy" else 0) as pinned:
            print(f"phase {phase}" + (f": busy loops on cores {pinned}" if pinned else ""), flush=True)
            first = {s.name: attempt(s, failed, "decode", args.tokens) for s in live}
            live = [s for s in live if first[s.name] is not FAILED]
            times = {s.name: [] for s in live}
            for _ in range(args.repeats):  # interleaved: A B C A B C ...
                for s in list(live):
                    seconds = attempt(s, failed, "decode", args.tokens)
                    if seconds is FAILED:
                        live.remove(s)
                        del times[s.name]
                    else:
                        times[s.name].append(seconds)
            for s in live:
                results.setdefault(s.name, {})[phase] = {
                    "first_tok_s": 1 / first[s.name],
                    "tok_s": 1 / median(times[s.name]),
                    "threads_after": threads_of(s),
                }
    close_all(systems)
    results = {
        name: r for name, r in results.items() if name not in failed
    }  # a baseline that failed mid-way: its reason only
    rows = [
        {
            "system": name,
            **{f"{p} tok/s": r[p]["tok_s"] for p in PHASES},
            "busy first tok/s": r["busy"]["first_tok_s"],
            "quiet again first tok/s": r["quiet again"]["first_tok_s"],
            "busy / quiet": r["busy"]["tok_s"] / r["quiet"]["tok_s"],
            "threads when busy": r["busy"]["threads_after"],
        }
        for name, r in results.items()
    ]
    print_table(
        f"Batch-1 decode after a {prompt_len}-token prompt, {args.busy_cores} of {cores} cores busy in the "
        f"middle phase (median tokens/s; 'first': the phase's first {args.tokens} tokens)",
        list(rows[0]),
        rows,
    )
    plot(results, Path(args.out))
    for name, reason in failed.items():
        print(f"{name}: failed: {reason}\n", flush=True)
    payload = {
        "weights": args.weights,
        "prompt": prompt_len,
        "tokens": args.tokens,
        "repeats": args.repeats,
        "busy_cores": args.busy_cores,
        "threads": args.threads,
        "results": results,
        "failed": failed,
    }
    write_json(Path(args.out), "contention", payload)
    return payload


def threads_of(system) -> int:
    governor = getattr(getattr(system, "engine", None), "governor", None)
    return governor.threads if governor is not None else torch.get_num_threads()


def plot(results: dict, out: Path) -> Path:
    fig, ax = new_figure("Decode with other processes on the cores", "phase", "tokens/s", log_y=True)
    for name, r in results.items():
        ax.plot(list(PHASES), [r[p]["tok_s"] for p in PHASES], marker="o", label=name)
    return save_figure(fig, out, "contention")
