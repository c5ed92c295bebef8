#!/bin/bash
# The AMX Xeon quiet-window run (session 15; sessions 16 and 17 ran it again into their own OUT): everything
# sequential, nothing else running.
cd "$(dirname "$0")/../.."
OUT=${OUT:-docs/bench-amx-s15}
B=.venv/bin/latentkv
grep -m1 flags /proc/cpuinfo > $OUT/cpuflags.txt
date
$B bench prefix --store --prefixes 1024 4096 --repeats 3 --threads 2 --concurrency 8 --out $OUT/store > $OUT/store.txt 2>&1
date
$B bench decode --threads 2 --contexts 128 4096 8192 --weights none w4a8 --stock "" --tokens 32 --repeats 1 --out $OUT/decode > $OUT/decode.txt 2>&1
date
$B bench throughput --threads 2 --concurrency 1 32 --repeats 1 --out $OUT/throughput > $OUT/throughput.txt 2>&1
date
$B bench serve --vllm .venv-vllm/bin/python --threads 2 --concurrency 1 8 32 --repeats 1 --out $OUT/serve > $OUT/serve.txt 2>&1
date
bash docs/bench-zen4-s10/vllm_client.sh > $OUT/vllm_client.txt 2>&1
date
$B bench serve --vllm .venv-vllm/bin/python --threads 2 --scenario pressure --systems latentkv vllm-original --kv-cache-dtype int8 --repeats 1 --out $OUT/pressure-int8 > $OUT/pressure-int8.txt 2>&1
date
