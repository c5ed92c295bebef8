#!/bin/bash
# The Zen 4 quiet-window run (session 10): everything sequential, nothing else running.
set -x
cd /work/main
OUT=docs/bench-zen4-s10
B=.venv/bin/latentkv
grep -m1 flags /proc/cpuinfo > $OUT/cpuflags.txt
date
# kernel A/B: the VNNI rank-240 path vs the commit before it (wt-old = b2dd879)
for d in /work/wt-old /work/main /work/wt-old /work/main; do (cd $d; PYTHONPATH=$PWD /work/main/.venv/bin/python -m latentkv.cli bench kernel --threads 2 --heads 9 --rank 240 --rope 32 --latents int8 bf16 --contexts 8192 --batches 1 8 --repeats 5 --out /tmp/kb-$(basename $d) 2>&1 | grep -E "^ +[0-9]|^batch" | sed "s|^|$(basename $d) |"); done > $OUT/kernel-ab.txt
date
$B bench decode --threads 2 --contexts 128 8192 --weights none w4a8 --stock "" --tokens 32 --repeats 1 --out $OUT/decode > $OUT/decode.txt 2>&1
date
$B bench throughput --threads 2 --concurrency 1 32 --repeats 1 --out $OUT/throughput > $OUT/throughput.txt 2>&1
date
$B bench prefix --store --prefixes 4096 --repeats 2 --threads 2 --concurrency 8 --out $OUT/store > $OUT/store.txt 2>&1
date
$B bench serve --vllm .venv-vllm/bin/python --threads 2 --concurrency 1 8 32 --repeats 1 --out $OUT/serve > $OUT/serve.txt 2>&1
date
