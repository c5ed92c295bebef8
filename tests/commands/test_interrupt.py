"""`latentkv generate` and `latentkv store warm` stopped by SIGTERM while blocks wait in the KV store's
write-behind queue (each write slowed down, each step too): the command unwinds, writes the whole queue
(logged: none dropped), and exits 143; a second SIGTERM during that exits at once."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest

from latentkv.store.store import SUFFIX
from tiny_lm import save_tiny_lm

# the child: the store's writes and the engine's steps slowed down, then the command line as given. A
# write takes 0.1 s: the ~14 blocks queued at the signal take over a second to write, so the second
# signal (0.3 s after the first) lands inside that (at 0.02 s a write, the queue was sometimes written
# before it came, and the process died of the default SIGTERM: exit -15)
CHILD = """
import sys, time
from latentkv.engine.engine import LLMEngine
from latentkv.store.store import LatentStore
write, step = LatentStore.write, LLMEngine.step
LatentStore.write = lambda self, block: time.sleep(0.1) or write(self, block)
LLMEngine.step = lambda self: time.sleep(0.1) or step(self)
from latentkv.cli import main
sys.exit(main(sys.argv[1:]))
"""
FLAGS = ["--dtype", "float32", "--block-size", "4", "--kv-cache-memory", "4MiB", "--max-model-len", "256"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("interrupt_model") / "tiny"
    save_tiny_lm(folder)
    return folder


def command(kind: str, model_dir, tmp_path) -> list[str]:
    store = str(tmp_path / "store")
    if kind == "generate":
        prompt = "the quick brown fox jumps over the lazy dog " * 4
        return ["generate", str(model_dir), "--prompt", prompt, "--max-tokens", "150", "--kv-store", store, *FLAGS]
    templates = tmp_path / "t.jsonl"
    templates.write_text("".join(json.dumps({"prompt_token_ids": list(range(i, i + 40))}) + "\n" for i in range(20)))
    return ["store", "warm", store, str(templates), str(model_dir), *FLAGS, "--max-num-batched-tokens", "64"]


@pytest.mark.parametrize("kind, signals", [("generate", 1), ("warm", 1), ("warm", 2)])
def test_sigterm_writes_the_queue_and_exits_143(model_dir, tmp_path, kind, signals):
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *command(kind, model_dir, tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob(f"store/*/blocks/*/*{SUFFIX}")):  # writing, with more queued
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no block was written"
            time.sleep(0.05)
        for _ in range(signals):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    files = len(list(tmp_path.glob(f"store/*/blocks/*/*{SUFFIX}")))
    if signals == 2:
        assert "second signal (15): exiting now" in err and "queued block(s) written" not in err
        return
    written = re.search(r"KV store: (\d+) queued block\(s\) written, 0 dropped", err)
    assert written and int(written[1]) > 0, err  # what was still queued at the signal reached the disk
    assert files >= int(written[1])
    assert "Traceback" not in err
