#!/usr/bin/env bash
# The q4_0 rows of issue 30's frontier (2026-12-03): AMD EPYC with avx512_bf16 (no AMX),
# 2 threads, quality only. llama.cpp and reference rows: ../xeon (the same held-out prompts).
set -euo pipefail
grep -m1 flags /proc/cpuinfo > cpuflags.txt
# the exact conversion (rope 192 + rank 192), scored in q4_0 blocks
latentkv convert --out exact --rope-dim all --kv-rank full --eval-tokens 0
# --kv-bytes at the q4_0 budget and at a quarter of the f16 cache: both chose q4_0 (kv6480: rope 160 + rank 224,
# kv5760: rope 128 + rank 212); the budget folders are made by the bench
latentkv bench frontier --systems latentkv --budgets 6480 5760 --folders exact:q4_0 --out frontier --threads 2
# decode speed of the same folder in int8 and q4_0 (bf16, the auto dtype here)
latentkv bench decode --model exact --no-baselines --threads 2 --contexts 128 4096 --weights none \
    --kv-cache-dtypes int8 q4_0 --out decode
# the plot in docs/conversion.md: the Xeon run's (../xeon) llama.cpp, reference and conversion rows (less its pre-q4_0 budget
# rows) with these
python -c "import json; from pathlib import Path; from latentkv.bench.frontier import plot_frontier; \
xeon = '../xeon/'; old = json.load(open(xeon + 'frontier.json'))['rows']; \
rows = [r for r in old if 'kv6480' not in r['system'] and 'kv5760' not in r['system']] \
     + json.load(open(xeon + 'reference.json'))['rows'] + json.load(open('frontier/frontier.json'))['rows']; \
plot_frontier(rows, Path('.'))"   # -> frontier.png (committed as frontier-all.png)
