"""Per-sequence failure isolation for one engine step.

`run_isolated` runs the scheduled batch; if that raises, nothing of it is kept and each
sequence is rerun alone, so an exception — from a parameter that slipped past
validation, a kernel bug, anything — fails only the sequences that raise by
themselves. Rerunning is safe: a sequence's new latents go to its own (not yet
registered) blocks at the same slots, and seeded generators are rewound first so a
retried sequence draws exactly what it would have drawn.
"""

from __future__ import annotations

import sys
import traceback

from latentkv.engine.runner import SeqResult
from latentkv.engine.scheduler import SchedulerOutput


def describe_failure(err: BaseException) -> str:
    return f"internal error in this request: {type(err).__name__}: {err}"


def run_isolated(runner, out: SchedulerOutput) -> list[SeqResult | str]:
    """One entry per `out.scheduled`, in order: its SeqResult, or the error message of a
    sequence that fails even when run alone."""
    seeded = [s.seq for s in out.scheduled if s.seq.generator is not None]
    states = [seq.generator.get_state() for seq in seeded]
    try:
        return runner.run(out)
    except Exception:  # noqa: BLE001 - find out whose it is
        print("latentkv: a batched step failed; retrying its sequences one at a time", file=sys.stderr)
        traceback.print_exc()
    for seq, state in zip(seeded, states):
        seq.generator.set_state(state)
    results: list[SeqResult | str] = []
    for s in out.scheduled:
        try:
            results += runner.run(SchedulerOutput(scheduled=[s]))
        except Exception as err:  # noqa: BLE001 - this sequence's own failure
            results.append(describe_failure(err))
    return results
