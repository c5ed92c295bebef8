"""The thread governor (engine/threads.py): backs off when the step thread waits for a core,
comes back when the other processes free one, and leaves an explicit thread count alone.
The run-queue and /proc/stat readings are replaced by fakes, so the decisions are checked
without a busy machine."""

from __future__ import annotations

import os
import time

import pytest
import torch
from threads import torch_threads

from latentkv.engine import threads
from latentkv.engine.threads import BUSY_WINDOWS, ThreadGovernor, waited_seconds
from latentkv.llm import LLM


class FakeMachine:
    """run_queue_ns / busy_seconds / process_time, driven by the test."""

    def __init__(self, monkeypatch, cores: int = 2):
        self.delay_ns, self.busy, self.own = 0, 0.0, 0.0
        monkeypatch.setattr(threads, "run_queue_ns", lambda: {1: self.delay_ns, 2: 0})
        monkeypatch.setattr(threads, "WINDOW_SECONDS", 0.001)  # every step a window
        monkeypatch.setattr(threads, "busy_seconds", lambda _cores: self.busy)
        monkeypatch.setattr(threads, "own_seconds", lambda: self.own)
        monkeypatch.setattr(threads, "allowed_cores", lambda: set(range(cores)))
        monkeypatch.setattr(threads, "CHECK_SECONDS", 0.001)  # a look every step (steps take ~4 ms)

    def step(self, gov: ThreadGovernor, waited_share: float, others_busy_cores: float = 0.0) -> None:
        """One step of ~4 ms; the threads wait `waited_share` thread-seconds per second of it, the
        other processes keep `others_busy_cores` cores busy and the engine its current threads."""
        gov.before_step()
        start = time.perf_counter()
        time.sleep(0.004)
        wall = time.perf_counter() - start
        self.delay_ns += int(waited_share * wall * 1e9)
        self.busy += (others_busy_cores + gov.threads) * wall
        self.own += gov.threads * wall
        gov.after_step()


def backed_off(machine: FakeMachine) -> ThreadGovernor:
    """A 2-thread governor that has just backed off to 1 (another process holds a core)."""
    gov = ThreadGovernor(2, adaptive=True)
    for _ in range(BUSY_WINDOWS):
        machine.step(gov, waited_share=0.9, others_busy_cores=1)
    assert gov.threads == 1
    return gov


def test_backs_off_one_thread_after_busy_steps(monkeypatch):
    machine = FakeMachine(monkeypatch)
    with torch_threads(2):
        gov = ThreadGovernor(2, adaptive=True)
        for _ in range(BUSY_WINDOWS - 1):
            machine.step(gov, waited_share=0.9, others_busy_cores=1)
        assert gov.threads == 2 and torch.get_num_threads() == 2  # not yet: one slow step is not a trend
        machine.step(gov, waited_share=0.9, others_busy_cores=1)
        assert gov.threads == 1 and torch.get_num_threads() == 1
        for _ in range(2 * BUSY_WINDOWS):  # never below one thread; the other process still holds a core
            machine.step(gov, waited_share=0.9, others_busy_cores=1)
        assert gov.threads == 1


def test_quiet_steps_keep_every_thread(monkeypatch):
    machine = FakeMachine(monkeypatch)
    with torch_threads(2):
        gov = ThreadGovernor(2, adaptive=True)
        for i in range(4 * BUSY_WINDOWS):  # waits below the share, or busy steps that are not consecutive
            machine.step(gov, waited_share=0.9 if i % BUSY_WINDOWS == 0 else 0.01)
        assert gov.threads == 2 and torch.get_num_threads() == 2


def test_comes_back_when_a_core_is_free_and_not_before(monkeypatch):
    machine = FakeMachine(monkeypatch)
    with torch_threads(2):
        gov = backed_off(machine)
        for _ in range(5):  # the other process still holds its core
            machine.step(gov, waited_share=0.0, others_busy_cores=1)
        assert gov.threads == 1
        for _ in range(3):  # it stopped: the first reading marks, the next one sees the free core
            machine.step(gov, waited_share=0.0, others_busy_cores=0)
        assert gov.threads == 2 and torch.get_num_threads() == 2


def test_idle_gaps_of_the_engine_are_not_free_cores(monkeypatch):
    """Between requests the engine's own cores idle; only the other processes' use counts."""
    machine = FakeMachine(monkeypatch)
    with torch_threads(2):
        gov = backed_off(machine)
        for _ in range(3):
            time.sleep(0.02)  # no step: the engine's cores idle, the other process keeps its core
            machine.busy += 0.02
            machine.step(gov, waited_share=0.0, others_busy_cores=1)
        assert gov.threads == 1


def test_waits_count_over_every_thread_alive_at_both_readings():
    """A worker may wait while the stepping thread spins on a free core; ended threads drop out."""
    assert waited_seconds({1: 0, 2: 5_000_000, 3: 9}, {1: 0, 2: 405_000_000, 4: 7}) == 0.4


def test_not_adaptive_off_linux_readings_or_on_one_thread(monkeypatch):
    monkeypatch.setattr(threads, "run_queue_ns", lambda: None)
    assert not ThreadGovernor(2, adaptive=True).adaptive
    monkeypatch.undo()
    assert not ThreadGovernor(1, adaptive=True).adaptive


@pytest.mark.parametrize("explicit", [True, False])
def test_engine_governs_only_a_thread_count_it_chose(tiny_lm, monkeypatch, explicit):
    monkeypatch.delenv("LATENTKV_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    folder, _, _ = tiny_lm()
    with torch_threads(torch.get_num_threads()):  # the engine sets the process's count: put it back
        llm = LLM(str(folder), dtype="float32", kv_cache_memory="4MiB", threads=1 if explicit else None)
        gov = llm.engine.governor
        assert gov.start == (1 if explicit else len(os.sched_getaffinity(0)))
        assert gov.adaptive == (not explicit and gov.start > 1 and threads.run_queue_ns() is not None)


def test_each_step_runs_on_its_engines_count(monkeypatch):
    """torch's thread count is per process: a step puts its engine's count back first."""
    FakeMachine(monkeypatch)
    with torch_threads(3):
        fixed = ThreadGovernor(2, adaptive=False)
        fixed.before_step()
        assert torch.get_num_threads() == 2
        fixed.after_step()


def test_a_thread_lost_again_soon_after_doubles_the_wait(monkeypatch):
    """Waits the other processes do not explain (this process's own threads) must not flap the count."""
    machine = FakeMachine(monkeypatch)
    with torch_threads(2):
        gov = backed_off(machine)
        assert gov.wait == threads.CHECK_SECONDS  # a first back-off: the usual wait
        for _ in range(3):
            machine.step(gov, waited_share=0.0)
        assert gov.threads == 2
        for _ in range(BUSY_WINDOWS):  # lost again at once
            machine.step(gov, waited_share=0.9)
        assert gov.threads == 1 and gov.wait == 2 * threads.CHECK_SECONDS


def test_release_frees_the_calling_threads_openmp_pool():
    """release_openmp_pool (what the server's engine start calls in the thread that built the
    model): the calling thread's OpenMP workers are gone after it, and the next parallel region
    makes a new pool with the same results."""
    x = torch.randn(4_000_000, generator=torch.Generator().manual_seed(0))
    with torch_threads(2):
        total = x.sum()  # a parallel region: this thread's pool has a worker
        before = len(os.listdir("/proc/self/task"))
        if not threads.release_openmp_pool():
            pytest.skip("the OpenMP runtime here is not libgomp")
        deadline = time.monotonic() + 5
        while len(os.listdir("/proc/self/task")) >= before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(os.listdir("/proc/self/task")) < before
        assert torch.equal(x.sum(), total)
