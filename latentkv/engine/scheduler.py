"""Who runs this step, and with how many tokens.

Continuous batching with one token budget per step (`max_num_batched_tokens`):
running sequences go first (a decode costs 1 token, an unfinished chunked prefill
its next chunk), then waiting sequences are admitted in arrival order with
(possibly chunked) prefills while budget, `max_num_seqs` and free blocks allow.

When a running sequence needs a block and none is free, the most recently admitted
running sequence is preempted: its blocks go back to the pool and it returns to the
*front* of the waiting queue, to be recomputed (prompt + output so far) later —
usually cheaply, since its freed full blocks stay in the prefix cache. Oldest
sequences therefore always make progress (no deadlock), and the preempted one is
the next admitted (no starvation).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from latentkv.engine.kv_manager import KVManager
from latentkv.engine.sequence import Sequence, Status


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int

    @property
    def picks_token(self) -> bool:
        """Does this chunk reach the end of the sequence (so its last logits pick a token)?"""
        return self.seq.num_computed_tokens + self.num_new_tokens == len(self.seq)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    def __bool__(self) -> bool:
        return bool(self.scheduled)


class Scheduler:
    def __init__(self, kv: KVManager, max_num_seqs: int, max_num_batched_tokens: int):
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be >= 1")
        self.kv = kv
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: last = newest
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step ----------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.schedule_running(out, self.max_num_batched_tokens)
        if not out.preempted:  # admitting now would only preempt again next step
            self.schedule_waiting(out, budget)
        return out

    def schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.kv.can_grow(seq, n):
                victim = self.running.pop()
                self.preempt(victim)
                out.preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                break  # `seq` preempted itself: it was the newest, nothing follows it
            self.kv.grow(seq, n)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n
            i += 1
        return budget

    def schedule_waiting(self, out: SchedulerOutput, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hits = self.kv.find_cached_prefix(seq)
            n = min(len(seq) - len(hits) * self.kv.block_size, budget)
            if not self.kv.can_admit(seq, hits, n):
                break  # first come first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            self.kv.admit(seq, hits)
            self.kv.grow(seq, n)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSeq(seq, n))
            budget -= n

    def preempt(self, seq: Sequence) -> None:
        self.kv.release(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    # -- after the model ran -----------------------------------------------------
    def mark_computed(self, out: SchedulerOutput) -> None:
        """The step wrote the latents of every scheduled token: advance and cache blocks."""
        for s in out.scheduled:
            s.seq.num_computed_tokens += s.num_new_tokens
            self.kv.register_full_blocks(s.seq)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished (or aborted) sequence from the queues and free its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.kv.release(seq)
