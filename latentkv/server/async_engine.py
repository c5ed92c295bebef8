"""The server's one engine loop: an `LLMEngine` stepped in a background thread.

HTTP handlers (on the asyncio loop) never touch the engine: they send commands ("add",
"abort") through a thread-safe queue and read each request's outputs from its own
asyncio queue. Tokenization and chat templating (the `prepare` callable of an add) run
in one tokenizer thread with its own copy of the tokenizer — not in the engine thread,
so a huge prompt never stalls the other requests' steps, and not on the event loop.
"""

from __future__ import annotations

import asyncio
import copy
import queue
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from latentkv.engine.outputs import RequestOutput
from latentkv.engine.prompt_errors import PromptError
from latentkv.engine.threads import release_openmp_pool
from latentkv.sampling_params import SamplingParams


class EngineDeadError(RuntimeError):
    """The engine loop stopped (crashed or shut down); the server cannot serve."""


class ShutdownError(EngineDeadError):
    """The server is shutting down: this request was refused, or it ran past the shutdown
    timeout and was ended (503 with Retry-After in OpenAI's format; an error event in a stream)."""

    code = "server_shutting_down"


class EngineStepError(RuntimeError):
    """An engine step raised; the requests in flight then were failed and aborted."""


@dataclass
class Submission:
    request_id: str
    prepare: Callable  # tokenizer -> (prompt text or None, prompt token ids)
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue
    accepted: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)
    text: str | None = None  # filled by `prepare` in the tokenizer thread
    token_ids: list[int] = field(default_factory=list)


class AsyncEngine:
    """Owns the engine thread; `generate` is the per-request async iterator of outputs."""

    def __init__(self, engine, on_finish: Callable[[RequestOutput], None] | None = None):
        self.engine = engine
        self.on_finish = on_finish or (lambda out: None)
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.wakeup = threading.Event()
        self.streams: dict[str, Submission] = {}
        self.stats = engine.stats()
        self.lock = threading.Lock()
        self.num_seqs_in_flight = 0  # sequences submitted and not yet finished
        self.stopping = False
        self.error: str | None = None
        self.refusing: ShutdownError | None = None  # set by `end_all`: no request is taken any more
        self.thread = threading.Thread(target=self.run, name="latentkv-engine", daemon=True)
        # the engine thread detokenizes with engine.tokenizer; prompts get their own copy and thread
        self.tokenizer = copy.deepcopy(engine.tokenizer)
        self.tokenize_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="latentkv-tokenize")

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        # this thread's OpenMP pool (it built the model) would make every step of the engine
        # thread's kernels sleep at their barriers (engine/threads.py release_openmp_pool)
        release_openmp_pool()
        self.thread.start()

    def stop(self) -> None:
        self.stopping = True
        self.wakeup.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)
        self.tokenize_pool.shutdown(wait=False, cancel_futures=True)

    def end_all(self, err: ShutdownError) -> None:
        """Shutdown: take no request from now on and end every one the engine holds with `err`
        (in the engine thread, which aborts them and frees their blocks)."""
        self.refusing = err
        self.commands.put(("end_all", err))
        self.wakeup.set()

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.error is None

    # -- the frontend side ------------------------------------------------------------------
    def waiting_after(self, num_seqs: int) -> int:
        """How many sequences would wait for a running slot if `num_seqs` more came now."""
        with self.lock:
            in_flight = self.num_seqs_in_flight
        return max(0, in_flight + num_seqs - self.engine.args.max_num_seqs, self.stats["waiting"])

    async def add(self, request_id: str, prepare: Callable, params: SamplingParams) -> Submission:
        """Prepare (tokenize) the prompt in the tokenizer thread, then queue the request;
        returns once the engine accepted it. Raises ValueError (bad prompt: anything
        `prepare` raises is the prompt's fault) or EngineDeadError."""
        if self.refusing is not None:
            raise ShutdownError(str(self.refusing))
        if not self.alive:
            raise EngineDeadError(self.error or "the engine loop is not running")
        loop = asyncio.get_running_loop()
        sub = Submission(request_id, prepare, params, loop, asyncio.Queue(), loop.create_future())
        try:
            sub.text, sub.token_ids = await loop.run_in_executor(self.tokenize_pool, prepare, self.tokenizer)
        except ValueError:
            raise
        except Exception as err:  # noqa: BLE001 - e.g. a tokenizer's TypeError on odd text
            raise PromptError(f"cannot tokenize the prompt: {type(err).__name__}: {err}") from None
        with self.lock:
            self.num_seqs_in_flight += params.n
        self.commands.put(("add", sub))
        self.wakeup.set()
        try:
            await sub.accepted
        except asyncio.CancelledError:  # the client left before the engine took it
            self.abort(request_id)
            raise
        return sub

    def abort(self, request_id: str) -> None:
        self.commands.put(("abort", request_id))
        self.wakeup.set()

    async def generate(self, sub: Submission):
        """Yield the request's cumulative outputs until it finishes; aborts it when the
        consumer stops early (a client disconnect cancels the consuming task)."""
        finished = False
        try:
            while not finished:
                item = await sub.outputs.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(sub.request_id)

    # -- the engine thread ----------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self.stopping:
                self.wakeup.clear()
                self.apply_commands()
                if not self.engine.has_unfinished_requests():
                    self.stats = self.engine.stats()
                    self.wakeup.wait(timeout=1.0)
                    continue
                try:
                    outputs = self.engine.step()
                except Exception as err:  # noqa: BLE001 - fail those requests, keep serving
                    traceback.print_exc()
                    self.fail_in_flight(EngineStepError(f"engine step failed: {type(err).__name__}: {err}"))
                    continue
                self.deliver(outputs)
                self.stats = self.engine.stats()
        except BaseException as err:  # a bug in the engine: fail everyone, report it
            self.error = f"engine loop crashed: {type(err).__name__}: {err}"
            traceback.print_exc()
        finally:
            self.fail_all(EngineDeadError(self.error or "the server is shutting down"))

    def drain_commands(self):
        """Yield (kind, payload) of every queued command, without blocking."""
        while True:
            try:
                yield self.commands.get_nowait()
            except queue.Empty:
                return

    def apply_commands(self) -> None:
        for kind, payload in self.drain_commands():
            if kind == "add":
                self.accept(payload)
            elif kind == "abort":
                out = self.engine.abort_request(payload)
                if out is not None:
                    self.deliver([out])
            elif kind == "end_all":
                self.fail_in_flight(payload)

    def accept(self, sub: Submission) -> None:
        if self.refusing is not None:  # tokenized while the shutdown ended the others
            self.release(sub.params.n)
            sub.loop.call_soon_threadsafe(set_exception_once, sub.accepted, ShutdownError(str(self.refusing)))
            return
        try:
            self.engine.add_request(sub.request_id, sub.text, sub.params, prompt_token_ids=sub.token_ids)
        except Exception as err:  # noqa: BLE001 - a bad prompt is the client's error
            self.release(sub.params.n)
            sub.loop.call_soon_threadsafe(set_exception_once, sub.accepted, err)
            return
        self.streams[sub.request_id] = sub
        sub.loop.call_soon_threadsafe(set_result_once, sub.accepted, None)

    def deliver(self, outputs: list[RequestOutput]) -> None:
        """Hand outputs to their streams, waking each event loop once for all of them (a wake-up
        per output wrote the loop's self-pipe 32 times a 32-sequence step, ~1 ms of the engine
        thread's step on 2 cores)."""
        batches: dict = {}  # loop -> [(queue, output)]
        for out in outputs:
            sub = self.streams.get(out.request_id)
            if sub is None:
                continue
            if out.finished:
                del self.streams[out.request_id]
                self.release(sub.params.n)
                self.on_finish(out)
            batches.setdefault(sub.loop, []).append((sub.outputs, out))
        for loop, items in batches.items():
            loop.call_soon_threadsafe(put_all, items)

    def release(self, num_seqs: int) -> None:
        with self.lock:
            self.num_seqs_in_flight -= num_seqs

    def fail_in_flight(self, err: BaseException) -> None:
        """Abort every request the engine holds and hand `err` to its consumer."""
        for request_id, sub in list(self.streams.items()):
            del self.streams[request_id]
            self.release(sub.params.n)
            self.engine.abort_request(request_id)
            sub.loop.call_soon_threadsafe(sub.outputs.put_nowait, err)

    def fail_all(self, err: BaseException) -> None:
        for sub in list(self.streams.values()):
            sub.loop.call_soon_threadsafe(sub.outputs.put_nowait, err)
        self.streams.clear()
        for kind, payload in self.drain_commands():
            if kind == "add":
                payload.loop.call_soon_threadsafe(set_exception_once, payload.accepted, err)


def put_all(items: list) -> None:
    """On the event loop: each (queue, output) in order."""
    for queue_, out in items:
        queue_.put_nowait(out)


def set_result_once(future: asyncio.Future, value) -> None:
    if not future.done():
        future.set_result(value)


def set_exception_once(future: asyncio.Future, err: BaseException) -> None:
    if not future.done():
        future.set_exception(err)
