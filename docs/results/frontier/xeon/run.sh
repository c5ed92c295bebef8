#!/usr/bin/env bash
# The frontier of issue 30 (2026-12-03): Intel Xeon (AMX), 2 threads, quality only
# (no timings; the three runs below shared the 2 cores). llama-cpp-python 0.3.36 in .venv (pip install latentkv[bench]).
set -euo pipefail
grep -m1 flags /proc/cpuinfo > cpuflags.txt
OUT=${OUT:-frontier}
# the default conversion (what `make serve` makes), measured in the int8 and int8_rope8 caches
latentkv convert --out default --eval-tokens 0
# the exact conversion (rope 192 + rank 192): --kv-bytes 12240 chose it in int8_rope8 (11,760 B/token)
latentkv convert --kv-bytes 12240 --eval-tokens 0 --out "$OUT/kv12240"
# the q4_0 budget and a quarter of the f16 cache
latentkv convert --kv-bytes 6480 --eval-tokens 0 --out "$OUT/kv6480"
latentkv convert --kv-bytes 5760 --eval-tokens 0 --out "$OUT/kv5760"
# llama.cpp f16 / q8_0 / q4_0 KV rows, the budget folders above (reused), and the given folders
latentkv bench frontier --out "$OUT" --threads 2 \
    --folders default:int8 default:int8_rope8 "$OUT/kv12240:int8" | tee frontier.txt
# the original's cache in each llama.cpp KV type, in latentkv's float32 reference forward (no llama.cpp numerics)
latentkv bench frontier --systems reference --out frontier-ref --threads 2   # -> reference.md / .json / .png
# an MHA shape: SmolLM2 with each KV head repeated (9 KV heads; the same function, a 3x larger GQA cache)
python make_mha.py ~/.cache/latentkv/converted/*-original-hf smollm2-mha
# its chat answers (the calibration's and eval chat's): the bundled ones, the same function, under the
# folder's fingerprint (generating them again with transformers takes ~25 min on 2 cores); see the note
latentkv convert smollm2-mha --kv-bytes 12240 --eval-tokens 0 --out mha_kv12240
latentkv eval chat mha_kv12240 --no-generate | tee mha-chat.txt          # its own cache (int8_rope8)
latentkv eval chat mha_kv12240 --no-generate --dtype bfloat16 | tee -a mha-chat.txt
# the plot in docs/conversion.md: both runs' rows in one figure
python -c "import json; from pathlib import Path; from latentkv.bench.frontier import plot_frontier; \
rows = json.load(open('$OUT/frontier.json'))['rows'] + json.load(open('frontier-ref/frontier.json'))['rows']; \
plot_frontier(rows, Path('.'))"
