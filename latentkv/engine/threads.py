"""The step's thread count backs off while other processes hold this machine's cores.

Why: the kernels' OpenMP teams spin at every barrier (libgomp's default; it is what makes a quiet
machine fast). When another process keeps a core busy, the engine's threads share the cores left,
and each of a step's hundreds of parallel regions waits for a partner thread's next time slice.
Measured on the 2-core AVX2 EPYC with one core busy (another process pinned to it): a batch-1
w4a8 decode step at 128 context took 1,500-1,860 ms on 2 threads against 21-27 ms on 1 (55-70x).
The signal is unambiguous: the run-queue delay of the process's threads (/proc/self/task/*/schedstat:
time spent runnable but not running) is ~0 on free cores and ~1 thread-second per second there.
All threads, not the stepping one alone: with an unpinned busy process the scheduler may put an
OpenMP worker beside it while the stepping thread spins alone on a free core.

Policy (Linux; only when the engine chose the thread count itself, all cores: an explicit
`threads=` / LATENTKV_THREADS / OMP_NUM_THREADS is kept as given):
- down: measured over windows of at least WINDOW_SECONDS of steps (reading every thread's
  counter costs ~0.1 ms a thread): when the threads waited for a core more than WAIT_SHARE
  thread-seconds per second in BUSY_WINDOWS windows in a row, one thread fewer (not below 1),
  said in one line on stderr;
- up: while below the count it started with, every CHECK_SECONDS it measures how many of the
  cores this process may use the *other* processes kept busy (/proc/stat's busy time less this
  process's own CPU time, so the engine's idle gaps between requests do not count as free
  cores); when a core more than the engine holds is free (FREE_CORE), one thread more. A thread
  taken back and lost again within RELAPSE_SECONDS doubles that wait (up to MAX_WAIT_SECONDS):
  the wait is then this process's own (its HTTP and tokenizer threads want a core too), which
  the measure of the other processes cannot see, and the count would flap.
Kernel results do not depend on the thread count (tests/model, tests/attention check 1 vs 2
threads bit for bit), so a change never changes an answer. Each step runs on its engine's count
(torch's is per process: two engines in one process, as in the benches, set it in turn).
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

import torch

from latentkv.cpu import allowed_cores

WAIT_SHARE = 0.3  # thread-seconds waited per second: quiet ~0.00; sharing a core 0.5-1.0
BUSY_WINDOWS = 2  # consecutive waiting windows before backing off (one may be a passing spike)
WINDOW_SECONDS = 0.2  # steps measured together (a slow step is a window alone)
CHECK_SECONDS = 2.0  # how often a backed-off engine looks for free cores
RELAPSE_SECONDS = 10.0  # backing off this soon after taking a thread back doubles the wait
MAX_WAIT_SECONDS = 64.0
FREE_CORE = 0.9  # a core's worth of time (minus noise) the others left free lets one thread back


def run_queue_ns() -> dict[int, int] | None:
    """{thread id: nanoseconds it has spent runnable but waiting for a CPU} over this process's
    threads, or None where /proc does not say."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    out = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat", "rb") as f:
                out[int(tid)] = int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the thread has ended
    return out or None


def waited_seconds(before: dict[int, int], after: dict[int, int]) -> float:
    """Run-queue seconds the threads alive at both readings added between them."""
    return sum(max(0, after[t] - before[t]) for t in after.keys() & before.keys()) / 1e9


def busy_seconds(cores: set[int]) -> float | None:
    """CPU seconds all processes have spent on `cores` since boot (/proc/stat), or None."""
    busy = 0
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                name, *fields = line.split()
                if not name.startswith(b"cpu") or name == b"cpu" or int(name[3:]) not in cores:
                    continue
                values = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
                busy += sum(values) - values[3] - values[4] - values[7]  # steal: the host's, not a process's
    except (OSError, ValueError):
        return None
    return busy / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU seconds this process has used (all its threads)."""
    return time.process_time()


class ThreadGovernor:
    """Call `before_step()` and `after_step()` around each engine step (in the thread that runs it)."""

    def __init__(self, threads: int, adaptive: bool):
        self.start = self.threads = threads
        self.cores = allowed_cores()
        self.adaptive = adaptive and threads > 1 and run_queue_ns() is not None and busy_seconds(self.cores) is not None
        self.busy = 0
        self.mark: tuple[float, dict[int, int]] | None = None  # the window's start: (wall, run-queue readings)
        self.usage_mark: tuple[float, float, float] | None = None  # (wall, all busy, own CPU) seconds
        self.wait = CHECK_SECONDS  # between looks for free cores
        self.raised_at = float("-inf")  # when a thread was last taken back

    def before_step(self) -> None:
        if torch.get_num_threads() != self.threads:  # another engine in this process set its own count
            torch.set_num_threads(self.threads)
        if self.adaptive and self.mark is None:
            self.mark = (time.perf_counter(), run_queue_ns() or {})

    def after_step(self) -> None:
        if not self.adaptive or self.mark is None:
            return
        wall = time.perf_counter() - self.mark[0]
        if wall < WINDOW_SECONDS:
            return
        share = waited_seconds(self.mark[1], run_queue_ns() or {}) / wall
        self.mark = None
        self.busy = self.busy + 1 if self.threads > 1 and share > WAIT_SHARE else 0
        if self.busy >= BUSY_WINDOWS:
            relapse = time.monotonic() - self.raised_at < RELAPSE_SECONDS
            self.wait = min(2 * self.wait, MAX_WAIT_SECONDS) if relapse else CHECK_SECONDS
            self.set(
                self.threads - 1,
                f"its threads waited for a core {share:.2f} s per second "
                f"over the last {1e3 * wall:.0f} ms of steps: more threads than free cores",
            )
        elif self.threads < self.start:
            self.look_for_free_cores()

    def look_for_free_cores(self) -> None:
        now, busy, own = time.monotonic(), busy_seconds(self.cores), own_seconds()
        if busy is None:
            return
        if self.usage_mark is None or now - self.usage_mark[0] < self.wait:
            self.usage_mark = self.usage_mark or (now, busy, own)
            return
        (wall0, busy0, own0), self.usage_mark = self.usage_mark, (now, busy, own)
        others = max(0.0, (busy - busy0) - (own - own0)) / (now - wall0)  # cores the other processes kept busy
        if len(self.cores) - others - self.threads >= FREE_CORE:
            self.raised_at = now
            self.set(self.threads + 1, f"the other processes now keep {others:.1f} of {len(self.cores)} cores busy")

    def set(self, threads: int, why: str) -> None:
        print(
            f"latentkv: threads {self.threads} -> {threads}: {why} (--threads N fixes the count)",
            file=sys.stderr,
            flush=True,
        )
        self.threads, self.busy, self.usage_mark = threads, 0, None
        torch.set_num_threads(threads)


def release_openmp_pool() -> bool:
    """Free the calling thread's OpenMP thread pool (libgomp's omp_pause_resource_all, hard: it
    frees the pool of the thread that calls it). Call it in the thread that built an engine before
    another thread steps it (the server's engine thread): that thread's kernels are then the
    process's only team.

    Why: libgomp keeps one pool per thread that ever opened a parallel region (the main thread
    did, loading the model); with more pool threads than cores it stops spinning at barriers and
    sleeps instead, and every one of a step's parallel regions then waits for a futex wake-up.
    Measured on the 2-core AMX Xeon, one bf16 576 -> 3072 linear of one row: 35 us in the thread
    that built everything, 130-140 us in a second thread, 39 us there once the first thread freed
    its pool; a batch-1 decode step 15 ms in the building thread against 30 ms in a second one.
    False where the OpenMP runtime is not libgomp (nothing to free, or nothing we can)."""
    try:
        gomp = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_GLOBAL)
    except OSError:
        return False
    return gomp.omp_pause_resource_all(2) == 0  # 2: omp_pause_hard
