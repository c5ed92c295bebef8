"""Write-behind: one daemon thread writes queued blocks to the store, off the decode path.

The queue is bounded (`max_pending` blocks); when it is full the engine drops the block
and counts it instead of waiting, so a slow disk never stalls decoding. The first write
error (disk full, permissions, the directory gone) prints one warning and stops writing
for the rest of the run (later blocks count as drops); reads go on.

`close(timeout)` is the shutdown's flush: it writes the whole queue, or what the timeout
allows (the rest is dropped and counted), and says how many blocks it wrote and dropped.
"""

from __future__ import annotations

import atexit
import queue
import sys
import threading
import time
from dataclasses import dataclass

import torch

from latentkv.store.files import StoredBlock
from latentkv.store.store import LatentStore

_STOP = object()


@dataclass
class FlushReport:
    """What a close wrote of the queue it found, what it dropped, and in how many seconds."""

    written: int = 0
    dropped: int = 0
    seconds: float = 0.0


def all_finite(block: StoredBlock) -> bool:
    return all(torch.isfinite(t).all() for ts in block.tensors for t in ts if t.is_floating_point())


class WriteBehind:
    def __init__(self, store: LatentStore, max_pending: int = 1024, failed: bool = False):
        """failed=True: a store that cannot be written (read-only): every block is a drop."""
        self.store = store
        self.queue: queue.Queue = queue.Queue(max_pending)
        self.failed = failed
        self.written = 0  # blocks this writer put on disk (or found there)
        self.drop_lock = threading.Lock()  # drops are counted by both threads
        self.thread = threading.Thread(target=self.loop, name="latentkv-store-writer", daemon=True)
        self.thread.start()
        atexit.register(self.close)  # an `LLM` user's last blocks still reach the disk

    def submit(self, block: StoredBlock) -> bool:
        if self.failed:
            return self.drop()
        try:
            self.queue.put_nowait(block)
            return True
        except queue.Full:
            return self.drop()

    def drop(self) -> bool:
        with self.drop_lock:
            self.store.counters.write_drops += 1
        return False

    def loop(self) -> None:
        while True:
            block = self.queue.get()
            try:
                if block is _STOP:
                    return
                if self.failed or not all_finite(block):  # NaN latents never reach the disk
                    self.drop()
                    continue
                self.store.write(block)
                self.written += 1
            except OSError as err:
                self.failed = True
                self.drop()
                print(
                    f"latentkv: warning: cannot write to the KV store {self.store.root} ({err}); "
                    "running on without writing to it",
                    file=sys.stderr,
                    flush=True,
                )
            finally:
                self.queue.task_done()

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every queued block is written; -> False on timeout."""
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks and self.thread.is_alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def close(self, timeout: float = 30.0) -> FlushReport:
        """Write what is queued within `timeout` seconds, drop (and count) the rest, stop the
        thread. Safe to call twice (the second finds nothing to do)."""
        start = time.monotonic()
        written, dropped = self.written, self.store.counters.write_drops
        atexit.unregister(self.close)
        if self.thread.is_alive():
            if not self.flush(timeout):
                self.discard()  # the disk is too slow for the bound: these blocks are lost, counted
            left = max(0.0, timeout - (time.monotonic() - start))
            try:
                self.queue.put(_STOP, timeout=max(left, 0.1))  # room: flush or discard emptied the queue
                self.thread.join(left)
            except queue.Full:  # blocks still come in: leave the daemon thread behind
                pass
        return FlushReport(self.written - written, self.store.counters.write_drops - dropped, time.monotonic() - start)

    def discard(self) -> None:
        """Drop every block still queued (the one being written, if any, finishes)."""
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                return
            self.drop()
            self.queue.task_done()
