"""SIGTERM and SIGINT for the commands that run an engine in the foreground (`generate`, `chat`,
`store warm`), so that a stopped command still writes the KV store's queue.

Python ends a process on SIGTERM without unwinding it (no `finally`, no atexit): the blocks queued
for the store were lost. Here the first SIGTERM unwinds as Ctrl-C does (`Interrupted`, a
KeyboardInterrupt), the command closes its engine — the store's queue is written within the
shutdown timeout and logged as the server logs it — and exits 128 + the signal. A signal that comes
while the queue is being written lets the writing go on; a second one exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from contextlib import contextmanager

from latentkv.server.shutdown import close_engine

LOST = "queued KV store writes are lost"


class Interrupted(KeyboardInterrupt):
    """The first SIGTERM, raised in the main thread where it was running."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class Signals:
    """The handler's state: a signal came already; the store's queue is being written."""

    def __init__(self):
        self.fired = False
        self.closing = False

    def __call__(self, signum, frame) -> None:
        if self.fired:
            log(f"latentkv: second signal ({signum}): exiting now; {LOST}")
            os._exit(128 + signum)
        self.fired = True
        if self.closing:
            log(f"latentkv: signal {signum}: writing the KV store's queue first (a second signal exits at once)")
            return
        raise Interrupted(signum)


ACTIVE: list[Signals] = []  # the handler in place, if any (signals are the process's)


@contextmanager
def sigterm_unwinds():
    """Within: the first SIGTERM raises Interrupted; a second one exits at once (128 + 15). The
    handler before is back afterwards (main() also runs inside the tests' processes)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach only the main thread's handlers
        return
    ACTIVE.append(Signals())
    previous = signal.signal(signal.SIGTERM, ACTIVE[-1])
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        ACTIVE.pop()


def exit_status(err: KeyboardInterrupt) -> int:
    """128 + the signal that stopped the command (SIGINT for Ctrl-C)."""
    return 128 + getattr(err, "signum", signal.SIGINT)


def close(engine, timeout: float) -> None:
    """Close the engine (the store's queue written within `timeout` s, and logged). A first SIGTERM
    or Ctrl-C during that lets it finish; a second one (or Ctrl-C outside `sigterm_unwinds`) exits
    at once."""
    if engine is None:
        return
    previous = None
    if ACTIVE:
        ACTIVE[-1].closing = True
        previous = signal.signal(signal.SIGINT, ACTIVE[-1])
    try:
        close_engine(engine, timeout)
    except KeyboardInterrupt as err:
        log(f"latentkv: interrupted: exiting now; {LOST}")
        os._exit(exit_status(err))
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
