"""What this CPU runs natively, and how many threads the engine uses (each rule stated once).

- `features()`: the instruction-set flags that matter to latentkv's kernels and dtypes.
- `native_bf16()`: bf16 matmuls run at speed only with avx512_bf16 or AMX; elsewhere PyTorch
  emulates them (measured 1.2 GFLOP/s against 116 in float32 on an AVX2-only EPYC), so
  `dtype="auto"` is bfloat16 only where this is True (`model.loader.resolve_dtype`).
- `default_threads()`: all cores this process may run on, unless LATENTKV_THREADS (or else
  OMP_NUM_THREADS, the usual knob) says otherwise (`threads_from_env()`); the engine then backs
  off while other processes hold cores (engine/threads.py).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

# The flags worth printing next to a benchmark (torch's cpuinfo names).
FLAGS = ("avx2", "fma3", "avx512_f", "avx512_bw", "avx512_vl", "avx512_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
_PROC_NAMES = {
    "fma3": "fma",
    "avx512_f": "avx512f",
    "avx512_bw": "avx512bw",
    "avx512_vl": "avx512vl",
    "avx512_vnni": "avx512_vnni",
    "avx512_bf16": "avx512_bf16",
    "amx_bf16": "amx_bf16",
    "amx_int8": "amx_int8",
    "avx2": "avx2",
}


@functools.cache
def features() -> dict[str, bool]:
    """{flag: bool} for FLAGS: from torch's cpuinfo, else /proc/cpuinfo, else all False."""
    try:
        caps = torch._C._cpu._get_cpu_capability()  # private but stable since 2.3; /proc below if it goes
        return {flag: bool(caps.get(flag, False)) for flag in FLAGS}
    except AttributeError:
        pass
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
        present = set(line.split(":", 1)[1].split())
    except (OSError, StopIteration):
        present = set()
    return {flag: _PROC_NAMES[flag] in present for flag in FLAGS}


def native_bf16() -> bool:
    flags = features()
    return flags["avx512_bf16"] or flags["amx_bf16"]


def describe() -> str:
    """'avx2 fma3 avx512_f ... (no amx_bf16 amx_int8)': printed with every benchmark table."""
    flags = features()
    have = [f for f in FLAGS if flags[f]]
    lack = [f for f in FLAGS if not flags[f]]
    return " ".join(have) + (f" (no {' '.join(lack)})" if lack else "")


def threads_from_env() -> int | None:
    """LATENTKV_THREADS if set, else OMP_NUM_THREADS (the usual knob), else None."""
    for name in ("LATENTKV_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name)
        if value:
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{name}={value!r}: expected a positive integer")
            return int(value)
    return None


def allowed_cores() -> set[int]:
    """The cores this process may run on (its affinity; every core where the OS does not say)."""
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return set(range(os.cpu_count() or 1))


def default_threads() -> int:
    """threads_from_env(), else every core this process may use."""
    from_env = threads_from_env()
    return from_env if from_env is not None else len(allowed_cores())
