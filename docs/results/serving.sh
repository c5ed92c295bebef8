#!/bin/bash
# Serving against vLLM-CPU with vLLM's own client (scripts/vllm_bench_client.py), one server at a time,
# 2 cores each, random 256 in / 128 out, --ignore-eos. What users send: SAMPLINGS (default: the client's
# default temperature 1.0, chat = 0.7 + top_p 0.9, greedy).
#   SmolLM2 (bundled, default conversion) vs vLLM on the original: 96 prompts, 32 in flight, 1 GiB KV each.
#   MODEL=<an MLA folder> (e.g. `latentkv bench random-model --shape deepseek-v3-mini --out DIR`): latentkv in
#   bf16, latentkv with --kv-cache-dtype int8 --quantization w4a8, and vLLM on the same folder (bf16,
#   block 32 on AMX): 64 prompts at 32 in flight and 6 at 1.
# SYSTEMS picks among the MODEL runs: latentkv-bf16 latentkv-w4a8 latentkv-w4a8_g128 vllm (default: bf16, w4a8, vllm).
# Usage: bash docs/results/serving.sh [smollm2|model] > out.txt
cd "$(dirname "$0")/../.."  # the repository root
grep -m1 -o 'flags.*' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|fma|avx512[a-z_0-9]*|amx[a-z_0-9]*)$' | tr '\n' ' '; echo
git log -1 --format='commit %h %cd' --date=short
SAMPLINGS=${SAMPLINGS:-default chat greedy}
PORT=8000
wait_up() { for i in $(seq 1 600); do curl -sf http://127.0.0.1:$PORT/v1/models >/dev/null && return 0; sleep 1; done; return 1; }
client() {  # $1 tokenizer, $2 prompts, $3 concurrency, $4 sampling; a client that reports nothing shows its last lines
  local out
  out=$(.venv-vllm/bin/python scripts/vllm_bench_client.py --port $PORT --model bench --tokenizer "$1" \
      --num-prompts "$2" --max-concurrency "$3" --sampling "$4" --random-input-len 256 --random-output-len 128 2>&1)
  echo "$out" | grep -E "^(Successful|Failed|Benchmark duration|Output token throughput|Mean TTFT|Median TTFT|Mean TPOT|Median ITL)" ||
    { echo "client failed:"; echo "$out" | tail -n 5; }
}
stop() {  # a server is gone once its process is and its port answers no more (latentkv drains on SIGTERM)
  kill "$1" 2>/dev/null
  while kill -0 "$1" 2>/dev/null; do sleep 1; done
  while curl -s -o /dev/null http://127.0.0.1:$PORT/; do sleep 1; done
}
latentkv() {  # $1 model, then serve flags
  local model=$1; shift
  OMP_NUM_THREADS=2 taskset -c 0-1 .venv/bin/latentkv serve $model --port $PORT --served-model-name bench \
      --no-enable-prefix-caching "$@" > /tmp/lkv-serve.log 2>&1 &
  echo $!
}
vllm() {  # $1 model, then vLLM flags
  local model=$1; shift
  OMP_NUM_THREADS=2 VLLM_CPU_OMP_THREADS_BIND=0-1 taskset -c 0-1 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \
      --model "$model" --port $PORT --host 127.0.0.1 --served-model-name bench --enforce-eager \
      --no-enable-prefix-caching --kv-cache-memory-bytes 1073741824 "$@" > /tmp/vllm-serve.log 2>&1 &
  echo $!
}
if [ "${1:-smollm2}" = smollm2 ]; then
  MODEL_DIR=$(.venv/bin/python -c 'from latentkv.resolve import resolve_model; print(resolve_model(None).path)')
  # the original as a transformers folder beside the conversion, made here if missing (as bench serve does)
  ORIG=$(.venv/bin/python -c 'import sys; from pathlib import Path; from latentkv.bench.models import ensure_hf_source
from latentkv.sources.readers import default_gguf_path; print(ensure_hf_source(Path(sys.argv[1]), default_gguf_path()))' "$MODEL_DIR")
  echo "== latentkv serve (bundled SmolLM2, default conversion and cache)"
  PID=$(latentkv "" --kv-cache-memory 1GiB)
  wait_up && for S in $SAMPLINGS; do echo "-- sampling $S"; client "$MODEL_DIR" 96 32 $S; done; stop $PID
  echo "== vLLM-CPU 0.32 on the original (bf16)"
  PID=$(vllm "$ORIG" --dtype bfloat16 --max-model-len 656 --max-num-seqs 32)
  wait_up && for S in $SAMPLINGS; do echo "-- sampling $S"; client "$MODEL_DIR" 96 32 $S; done; stop $PID
else
  MODEL=${MODEL:?set MODEL to an MLA folder}
  SYSTEMS=${SYSTEMS:-latentkv-bf16 latentkv-w4a8 vllm}
  for SYSTEM in $SYSTEMS; do
    case $SYSTEM in
      latentkv-bf16) FLAGS="" ;;
      latentkv-w4a8) FLAGS="--kv-cache-dtype int8 --quantization w4a8" ;;
      latentkv-w4a8_g128) FLAGS="--kv-cache-dtype int8 --quantization w4a8_g128" ;;
      *) continue ;;
    esac
    echo "== latentkv serve $MODEL ${FLAGS:-(bf16)}"
    PID=$(latentkv "$MODEL" --kv-cache-memory 1GiB --max-model-len 2048 $FLAGS)
    wait_up && for S in $SAMPLINGS; do echo "-- sampling $S, 32 in flight"; client "$MODEL" 64 32 $S;
                                        echo "-- sampling $S, 1 in flight"; client "$MODEL" 6 1 $S; done
    stop $PID
  done
  [[ " $SYSTEMS " == *" vllm "* ]] || exit 0
  echo "== vLLM-CPU 0.32 on the same folder (bf16, --block-size 32: AMX_MLA on AMX; elsewhere CPU_MLA, block 16)"
  PID=$(vllm "$MODEL" --dtype bfloat16 --block-size 32 --max-model-len 2048 --max-num-seqs 32)
  wait_up && for S in $SAMPLINGS; do echo "-- sampling $S, 32 in flight"; client "$MODEL" 64 32 $S;
                                      echo "-- sampling $S, 1 in flight"; client "$MODEL" 6 1 $S; done
  stop $PID
fi
