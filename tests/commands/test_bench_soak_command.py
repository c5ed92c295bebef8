"""`latentkv bench soak` and `bench shutdown`'s exit code, with the benchmark itself replaced: the bundled model
where --model is absent, 0 only where the result passed, 1 with the reason where a server failed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from latentkv.bench import shutdown, soak
from latentkv.bench.servers import PeerFailed
from latentkv.commands import bench_soak

SOAK = dict(minutes=0.1, concurrency=2)
SHUTDOWN = dict(rounds=1, prompt_tokens=64, in_flight=0, busy=0)
COMMANDS = [("soak", soak, bench_soak.run_soak, SOAK), ("shutdown", shutdown, bench_soak.run_shutdown, SHUTDOWN)]


@pytest.mark.parametrize("name, bench, command, options", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("passed", [True, False])
def test_the_exit_code_is_whether_the_result_passed(monkeypatch, name, bench, command, options, passed):
    runs = []
    monkeypatch.setattr(bench, "run", lambda args: runs.append(args.model) or {"of": args.model})
    monkeypatch.setattr(bench, "passed", lambda result: passed and result == {"of": "folder"})
    assert command(SimpleNamespace(model="folder", **options)) == (0 if passed else 1)
    assert runs == ["folder"]


@pytest.mark.parametrize("name, bench, command, options", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_a_failed_server_is_exit_code_1_with_its_reason(monkeypatch, capsys, name, bench, command, options):
    def fail(args):
        raise PeerFailed("server 0 exited with 3 before it answered")

    monkeypatch.setattr(bench, "run", fail)
    assert command(SimpleNamespace(model="folder", **options)) == 1
    assert capsys.readouterr().out == f"latentkv bench {name}: server 0 exited with 3 before it answered\n"


@pytest.mark.parametrize("name, bench, command, options", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_without_a_model_the_bundled_one_runs(monkeypatch, name, bench, command, options):
    monkeypatch.setattr(bench_soak, "default_models", lambda need_stock: ["bundled"] if not need_stock else [])
    monkeypatch.setattr(bench, "run", lambda args: {"of": args.model})
    monkeypatch.setattr(bench, "passed", lambda result: result == {"of": "bundled"})
    assert command(SimpleNamespace(model=None, **options)) == 0
