"""scripts/vllm_bench_client.py hands vLLM's benchmark entry point the defaults, then the user's flags
(later wins). vLLM is not installed here: a stand-in vllm.benchmarks.serve records what it gets."""
import runpy
import sys
import types
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "vllm_bench_client.py"


def test_defaults_then_the_users_flags_reach_vllms_main(monkeypatch):
    seen = []

    def add_cli_args(parser):  # a few of the flags vllm.benchmarks.serve.add_cli_args defines
        for flag in ("--backend", "--endpoint", "--dataset-name", "--model", "--tokenizer"):
            parser.add_argument(flag)
        for flag in ("--random-input-len", "--random-output-len", "--port", "--max-concurrency"):
            parser.add_argument(flag, type=int)
        parser.add_argument("--ignore-eos", action="store_true")

    serve = types.SimpleNamespace(add_cli_args=add_cli_args, main=seen.append)
    vllm = types.ModuleType("vllm")
    benchmarks = types.ModuleType("vllm.benchmarks")
    benchmarks.serve = serve
    for name, module in {"vllm": vllm, "vllm.benchmarks": benchmarks, "vllm.benchmarks.serve": serve}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--port", "9000", "--random-input-len", "1024", "--model", "bench"])
    runpy.run_path(str(SCRIPT), run_name="__main__")
    [args] = seen
    assert (args.backend, args.endpoint, args.dataset_name, args.ignore_eos) == ("openai", "/v1/completions", "random", True)
    assert (args.random_input_len, args.random_output_len, args.port, args.model) == (1024, 128, 9000, "bench")
