#!/bin/bash
# DeepSeek-V2-Lite shape on this box (session 11): everything sequential, nothing else running.
# 2 threads per system. The random checkpoint and its GGUF twin are made first (not timed).
set -x
cd /work/main
OUT=docs/bench-v2lite-s11
B=.venv/bin/latentkv
M=/work/models/v2lite
G=/work/models/v2lite-q4_0.gguf
grep -m1 flags /proc/cpuinfo > $OUT/cpuflags.txt
date
[ -f $G ] || /usr/bin/time -v $B export --gguf $M $G --outtype q4_0 > $OUT/export-gguf.txt 2>&1
date
sync; echo 3 > /proc/sys/vm/drop_caches  # the first load reads the folder from disk, as a user's first start does
/usr/bin/time -v $B generate $M --quantization w4a8 --threads 2 --max-tokens 16 --temperature 0 --prompt "The capital of France is" > $OUT/generate.txt 2>&1
sync; echo 3 > /proc/sys/vm/drop_caches
/usr/bin/time -v $B generate $M --quantization w4a8 --threads 2 --max-tokens 16 --temperature 0 --kv-cache-memory 256MiB --prompt "The capital of France is" > $OUT/generate-256MiB.txt 2>&1
date
$B bench memory --model $M --no-measure --out $OUT/memory > $OUT/memory.txt 2>&1
$B bench decode --model $M --source $G --stock "" --weights w4a8 --kv-cache-dtypes int8 --threads 2 --contexts 128 8192 --tokens 32 --repeats 2 --out $OUT/decode > $OUT/decode.txt 2>&1
date
$B bench throughput --model $M --source $G --quantization w4a8 --kv-cache-dtype int8 --threads 2 --concurrency 1 8 32 --repeats 1 --out $OUT/throughput > $OUT/throughput.txt 2>&1
date
# after the MoE stacking's malloc_trim (9c4f57c); the first of these ran beside `make test` (its time is not a load time)
sync; echo 3 > /proc/sys/vm/drop_caches
/usr/bin/time -v $B generate $M --quantization w4a8 --threads 2 --max-tokens 16 --temperature 0 --prompt "The capital of France is" > $OUT/generate-after-trim.txt 2>&1
/usr/bin/time -v $B generate $M --quantization w4a8 --threads 2 --max-tokens 16 --temperature 0 --kv-cache-memory 256MiB --prompt "The capital of France is" > $OUT/generate-256MiB-after-trim.txt 2>&1
# the GGUF export of the bundled SmolLM2's stock conversion, in llama.cpp against latentkv
$B convert --stock --out /work/models/smollm2-stock
$B export --gguf /work/models/smollm2-stock /work/models/smollm2-stock-f32.gguf --outtype f32
.venv/bin/python scripts/gguf_greedy_check.py /work/models/smollm2-stock /work/models/smollm2-stock-f32.gguf --tokens 32 > $OUT/gguf-smollm2-stock-f32.txt 2>&1
$B export --gguf /work/models/smollm2-stock /work/models/smollm2-stock-q8_0.gguf --outtype q8_0
.venv/bin/python scripts/gguf_greedy_check.py /work/models/smollm2-stock /work/models/smollm2-stock-q8_0.gguf --tokens 32 > $OUT/gguf-smollm2-stock-q8_0.txt 2>&1
$B bench serve --model $M --systems latentkv --quantization w4a8 --kv-cache-dtype int8 --quick --threads 2 --concurrency 1 4 --cache-memory 512MiB --no-baselines --out $OUT/serve > $OUT/serve.txt 2>&1
