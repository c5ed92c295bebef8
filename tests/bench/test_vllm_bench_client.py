"""scripts/vllm_bench_client.py hands vLLM's benchmark entry point the defaults, then the user's flags
(later wins). vLLM is not installed here: a stand-in vllm.benchmarks.serve records what it gets."""

import runpy
import sys
import types
from pathlib import Path

import pytest

from latentkv.bench.serve import SAMPLING

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vllm_bench_client.py"


def run_client(monkeypatch, argv: list[str]):
    """Run the script with a stand-in vllm.benchmarks.serve; the namespace its main got."""
    seen = []

    def add_cli_args(parser):  # a few of the flags vllm.benchmarks.serve.add_cli_args defines (0.32)
        for flag in ("--backend", "--endpoint", "--dataset-name", "--model", "--tokenizer"):
            parser.add_argument(flag)
        for flag in ("--random-input-len", "--random-output-len", "--port", "--max-concurrency"):
            parser.add_argument(flag, type=int)
        for flag in ("--temperature", "--top-p"):
            parser.add_argument(flag, type=float, default=None)
        parser.add_argument("--ignore-eos", action="store_true")

    serve = types.SimpleNamespace(add_cli_args=add_cli_args, main=seen.append)
    vllm = types.ModuleType("vllm")
    benchmarks = types.ModuleType("vllm.benchmarks")
    benchmarks.serve = serve
    for name, module in {"vllm": vllm, "vllm.benchmarks": benchmarks, "vllm.benchmarks.serve": serve}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *argv])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    [args] = seen
    return args


def test_defaults_then_the_users_flags_reach_vllms_main(monkeypatch):
    args = run_client(monkeypatch, ["--port", "9000", "--random-input-len", "1024", "--model", "bench"])
    assert (args.backend, args.endpoint, args.dataset_name, args.ignore_eos) == (
        "openai",
        "/v1/completions",
        "random",
        True,
    )
    assert (args.random_input_len, args.random_output_len, args.port, args.model) == (1024, 128, 9000, "bench")


@pytest.mark.parametrize("name", list(SAMPLING))
def test_sampling_sends_what_bench_serve_sends(monkeypatch, name):
    """--sampling NAME gives vLLM's client the flags whose request fields are bench serve's SAMPLING[NAME]."""
    args = run_client(monkeypatch, ["--port", "9000", "--sampling", name])
    sent = {"temperature": args.temperature, "top_p": args.top_p}
    assert {k: v for k, v in sent.items() if v is not None} == SAMPLING[name]


def test_a_later_sampling_flag_overrides_the_pass(monkeypatch):
    args = run_client(monkeypatch, ["--sampling=chat", "--temperature", "1.0"])
    assert (args.temperature, args.top_p) == (1.0, 0.9)
    with pytest.raises(SystemExit, match="expected one of"):
        run_client(monkeypatch, ["--sampling", "beam"])
