"""server/async_engine.py's delivery: a step's outputs reach their streams in order, each event loop
woken once a step, a finished request released and reported."""

import asyncio

from latentkv.engine.outputs import CompletionOutput, RequestOutput
from latentkv.sampling_params import SamplingParams
from latentkv.server.async_engine import AsyncEngine, Submission


class FakeEngine:
    tokenizer = None

    def stats(self) -> dict:
        return {"waiting": 0}


class RecordingLoop:
    """Runs what the engine thread hands it at once and counts the wake-ups."""

    def __init__(self):
        self.wakeups = 0

    def call_soon_threadsafe(self, fn, *args):
        self.wakeups += 1
        fn(*args)


def output(request_id: str, tokens: list[int], finished: bool) -> RequestOutput:
    return RequestOutput(request_id, None, [1, 2], [CompletionOutput(0, "", tokens)], finished)


def submit(engine: AsyncEngine, request_id: str, loop) -> Submission:
    sub = Submission(request_id, lambda tok: (None, [1, 2]), SamplingParams(max_tokens=4), loop, asyncio.Queue(), None)
    engine.streams[request_id] = sub
    engine.num_seqs_in_flight += 1
    return sub


def drain(queue: asyncio.Queue) -> list:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


def test_a_steps_outputs_reach_their_streams_with_one_wakeup_per_loop():
    finished = []
    engine = AsyncEngine(FakeEngine(), on_finish=finished.append)
    first, second = RecordingLoop(), RecordingLoop()
    a, b, c = submit(engine, "a", first), submit(engine, "b", first), submit(engine, "c", second)
    engine.deliver([output("a", [5], False), output("b", [6], False), output("c", [7], False)])
    engine.deliver([output("a", [5, 8], True), output("gone", [9], False), output("b", [6, 9], False)])
    assert first.wakeups == 2 and second.wakeups == 1  # one per loop and step; "gone" has no stream
    assert [o.outputs[0].token_ids for o in drain(a.outputs)] == [[5], [5, 8]]
    assert [o.outputs[0].token_ids for o in drain(b.outputs)] == [[6], [6, 9]]
    assert [o.outputs[0].token_ids for o in drain(c.outputs)] == [[7]]
    assert [o.request_id for o in finished] == ["a"]
    assert "a" not in engine.streams and engine.num_seqs_in_flight == 2
    engine.tokenize_pool.shutdown(wait=False)
