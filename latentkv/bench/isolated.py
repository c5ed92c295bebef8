"""A baseline system in its own process, so that a baseline that crashes is a result, not the end
of the bench (llama-cpp-python built natively segfaults at its first eval on some AMX CPUs).

`IsolatedSystem(name, factory, *args)` builds `factory(name, *args)` ("module:Class") in a spawned
process and forwards `prepare(prompt_ids)` and `decode(n)` to it over a pipe. If the process dies,
or the call raises there, `BaselineFailed` carries the reason: how it ended (exit code or signal)
and the last lines of its output (the child's stdout and stderr go to a log file).
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import tempfile
import traceback
from pathlib import Path

import torch

LOG_TAIL_LINES = 12
START_TIMEOUT_S = 1800  # a big original model loads (and transformers dequantizes a GGUF) for minutes


class BaselineFailed(RuntimeError):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _load(factory: str):
    module, _, attr = factory.partition(":")
    return getattr(importlib.import_module(module), attr)


def _serve(conn, log_path: str, threads: int, factory: str, name: str, args: tuple, kwargs: dict) -> None:
    """The child: output to the log, build the system, then answer calls until told to stop."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    torch.set_num_threads(threads)  # the bench's threads, as the parent's systems run
    try:
        system = _load(factory)(name, *args, **kwargs)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    conn.send(("ok", None))
    with torch.inference_mode():
        while True:
            op, arg = conn.recv()
            if op == "stop":
                return
            try:
                conn.send(("ok", getattr(system, op)(arg)))
            except Exception:
                conn.send(("error", traceback.format_exc()))


class IsolatedSystem:
    def __init__(self, name: str, factory: str, *args, **kwargs):
        self.name = name
        self.log = Path(tempfile.mkstemp(prefix="latentkv-baseline-", suffix=".log")[1])
        ctx = multiprocessing.get_context("spawn")  # no fork of the bench's threads and engines
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=_serve,
            args=(child, str(self.log), torch.get_num_threads(), factory, name, args, kwargs),
            daemon=True,
        )
        self.proc.start()
        child.close()
        self._answer("start", START_TIMEOUT_S)

    def _answer(self, what: str, timeout_s: float | None = None):
        try:
            if timeout_s is not None and not self.conn.poll(timeout_s):
                raise self._failed(f"{what}: no answer after {timeout_s:.0f} s")
            status, value = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(10)
            raise self._failed(what) from None
        if status != "ok":
            self.close()
            raise BaselineFailed(f"{self.name}: {what} raised:\n{tail(value)}")
        return value

    def _failed(self, what: str) -> BaselineFailed:
        code = self.proc.exitcode
        state = (
            "still running" if code is None else (f"killed by signal {-code}" if code < 0 else f"exited with {code}")
        )
        self.close()
        return BaselineFailed(
            f"{self.name}: {what} ({state}); last lines of its output:\n{tail(self.log.read_text(errors='replace'))}"
        )

    def call(self, op: str, arg):
        try:
            self.conn.send((op, arg))
        except (BrokenPipeError, OSError):
            raise self._failed(op) from None
        return self._answer(op)

    def prepare(self, prompt_ids: list[int]) -> None:
        self.call("prepare", list(prompt_ids))

    def decode(self, n: int) -> float:
        return self.call("decode", n)

    def close(self) -> None:
        if self.proc.is_alive():
            try:
                self.conn.send(("stop", None))
            except OSError:
                pass
            self.proc.join(10)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        self.conn.close()


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def start(failed: dict, name: str, factory: str, *args, **kwargs) -> list:
    """[the isolated system], or [] with its reason in `failed[name]` when it does not start."""
    try:
        return [IsolatedSystem(name, factory, *args, **kwargs)]
    except BaselineFailed as e:
        failed[name] = e.reason
        print(f"{name}: FAILED to start (recorded; the bench goes on): {e.reason}", flush=True)
        return []


FAILED = object()


def attempt(system, failed: dict, op: str, *args):
    """system.op(*args); a BaselineFailed is recorded in `failed` and gives FAILED (drop the system)."""
    try:
        return getattr(system, op)(*args)
    except BaselineFailed as e:
        failed[system.name] = e.reason
        print(f"{system.name}: FAILED (recorded; the bench goes on): {e.reason}", flush=True)
        return FAILED


def close_all(systems: list) -> None:
    for s in systems:
        if isinstance(s, IsolatedSystem):
            s.close()
