"""Baselines run in their own process (bench/isolated.py): a crash or a load error is recorded with
its reason, and the bench's loop goes on with the other systems (bench decode's measure_context)."""

import argparse
from pathlib import Path

import gguf
import numpy as np
import pytest

from latentkv.bench import systems
from latentkv.bench.decode import measure_context
from latentkv.bench.isolated import BaselineFailed, IsolatedSystem, start


@pytest.fixture(autouse=True)
def importable_fakes(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # a spawned child takes the parent's sys.path


class InProcess:
    """A system in this process, as latentkv's rows are."""

    name = "in process"

    def prepare(self, prompt_ids):
        self.n = len(prompt_ids)

    def decode(self, n):
        return 1.0 / self.n


def test_calls_reach_the_system_in_its_process():
    system = IsolatedSystem("steady", "fake_baseline:Steady", seconds=0.25)
    try:
        system.prepare([1, 2, 3, 4])
        assert system.decode(2) == 0.25 * 4 / 2
    finally:
        system.close()


def test_a_segfault_is_a_recorded_reason_with_the_output_before_it():
    system = IsolatedSystem("crashy", "fake_baseline:SegfaultOnDecode")
    system.prepare([1, 2])
    with pytest.raises(BaselineFailed) as failure:
        system.decode(2)
    assert "killed by signal 11" in failure.value.reason and "fake baseline: first eval" in failure.value.reason
    with pytest.raises(BaselineFailed):  # a dead baseline stays failed, it does not hang
        system.decode(2)


def test_a_baseline_that_does_not_load_is_recorded_and_left_out():
    failed = {}
    assert start(failed, "no weights", "fake_baseline:FailsToLoad") == []
    assert "no such weights" in failed["no weights"]


def test_the_decode_loop_goes_on_without_a_crashed_baseline():
    live = [
        InProcess(),
        IsolatedSystem("crashy", "fake_baseline:SegfaultOnDecode"),
        IsolatedSystem("steady", "fake_baseline:Steady"),
    ]
    failed = {}
    try:
        prefill, times = measure_context(live, [[5] * 8], argparse.Namespace(tokens=2, repeats=3), failed)
    finally:
        for s in live[1:]:
            s.close()
    assert [s.name for s in live] == ["in process", "steady"] and set(failed) == {"crashy"}
    assert set(prefill) == set(times) == {"in process", "steady"}
    assert times["steady"] == [0.5 * 8 / 2] * 3 and times["in process"] == [1 / 8] * 3


def test_a_transformers_baseline_that_would_not_fit_is_skipped_before_loading(tiny_checkpoints, monkeypatch):
    folder = tiny_checkpoints("v3_dense_qlora")[0]
    monkeypatch.setattr(systems, "available_memory", lambda device: 1024)  # less than any model needs
    monkeypatch.setattr(systems, "start", lambda *a, **k: pytest.fail("the baseline was started"))
    failed = {}
    assert systems.transformers_baseline("transformers original", folder, failed) == []
    assert (
        failed["transformers original"].startswith("skipped: ")
        and "GiB is available" in failed["transformers original"]
    )


def test_a_gguf_transformers_cannot_read_is_skipped(tmp_path, monkeypatch):
    path = tmp_path / "tiny-deepseek2.gguf"
    writer = gguf.GGUFWriter(str(path), "deepseek2")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert "cannot read a 'deepseek2' GGUF" in systems.transformers_cannot_load(path)
