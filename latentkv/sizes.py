"""Memory sizes: reading "2GiB"-style sizes, how much memory a device has free, this process's peak RSS,
giving freed heap memory back to the system, and keeping a serving step's memory for the next."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import resource
import sys
from pathlib import Path

import torch

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}


def parse_memory(value: int | float | str) -> int:
    """Bytes from an int or a string such as "2GiB", "512 MiB", "1.5GB", "4096"."""
    if isinstance(value, bool):
        raise ValueError(f"cannot read a memory size from {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"a memory size must be positive, got {value}")
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read a memory size from {value!r}; use bytes or e.g. '512MiB', '2GiB'")
    size = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if size <= 0:
        raise ValueError(f"a memory size must be positive, got {value!r}")
    return size


def available_memory(device: torch.device) -> int:
    """Free bytes on `device` now (CUDA: mem_get_info; CPU: MemAvailable)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """This process's peak resident set size in bytes, since it started or since reset_peak_rss: VmHWM
    of /proc/self/status (Linux), else ru_maxrss (KiB on Linux, bytes on macOS; it cannot be reset)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def reset_peak_rss() -> bool:
    """Restart peak_rss from the resident size now (Linux: "5" to /proc/self/clear_refs), so that what a
    measurement allocates for itself can be left out of the peak it reports; False where it cannot."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


@functools.cache
def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def return_freed_memory() -> bool:
    """Give the heap memory this process freed back to the system (glibc's malloc_trim(0)); False
    where the C library has no such call. glibc keeps freed chunks between live ones: packing a
    model's linears one after the other (long-lived buffers among large temporaries) left ~27% of
    the packed size resident but free (DeepSeek-V3-mini: 410 MiB over 1.5 GiB packed)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    return bool(trim is not None and trim(0) >= 0)


# mallopt's parameters (glibc malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
STEP_MMAP_THRESHOLD = 32 << 20  # glibc's largest: blocks below it come from the heap and are reused
STEP_TRIM_THRESHOLD = 1 << 30  # free heap kept before glibc gives it back
STEP_TOP_PAD = 64 << 20  # extra heap asked for each time it grows: fewer, larger extensions


def keep_freed_memory() -> bool:
    """Have glibc keep the heap memory a step frees for the next step (mallopt; False where the C
    library has no such call). By default each large temporary of a step (a 2,048-token prefill's
    activations, its rope tables: 5-13 MB each) is a fresh mmap and its first touch faults every
    page in: ~2,900 faults for 12 MB, each ~7 us once the process holds a few GiB (measured: the
    rope tables of a 2,048-row step took 25-68 ms instead of ~1 ms). With the mmap threshold at
    glibc's largest and the trim threshold high, the freed blocks stay in the heap and the next
    step's tensors reuse them (a prefill step then takes no page faults). What stays resident is
    bounded by a step's peak of temporaries, as with any caching allocator; the loader's explicit
    malloc_trim (return_freed_memory) still gives everything back."""
    libc = _libc()
    opt = getattr(libc, "mallopt", None)
    if opt is None:
        return False
    return all(
        opt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, STEP_MMAP_THRESHOLD),
            (_M_TRIM_THRESHOLD, STEP_TRIM_THRESHOLD),
            (_M_TOP_PAD, STEP_TOP_PAD),
        )
    )
