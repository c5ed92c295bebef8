#!/usr/bin/env bash
# 2026-12-03: the default conversion (exact, int8_rope8 recorded) and --kv-bytes 6480 / 5760 re-run on
# the current q4_0 turn; AMD EPYC avx512_bf16 (no AMX), 2 threads.
set -euo pipefail
grep -m1 flags /proc/cpuinfo > cpuflags.txt
latentkv convert --out default --eval-tokens 0
latentkv bench frontier --systems latentkv --budgets 6480 5760 --folders default --out frontier --threads 2
# the plot in docs/conversion.md: the Xeon run's (../xeon) llama.cpp, reference and conversion rows (less its budget rows and the
# previous default), ../epyc-q4's exact q4_0 row and these
python -c "import json; from pathlib import Path; from latentkv.bench.frontier import plot_frontier; \
xeon = '../xeon/'; old = json.load(open(xeon + 'frontier.json'))['rows']; \
keep = lambda r: not any(k in r['system'] for k in ('kv6480', 'kv5760', 'default_now')); \
rows = [r for r in old if keep(r)] + json.load(open(xeon + 'reference.json'))['rows'] \
     + json.load(open('../epyc-q4/frontier.json'))['rows'][:1] + json.load(open('frontier/frontier.json'))['rows']; \
plot_frontier(rows, Path('.'))"   # -> frontier.png (committed as frontier-all.png)
# speed of the new default (exact) against the previous one (rope 96 + rank 240), both in int8_rope8, one after the
# other on a quiet machine (each run with its transformers baseline: compare the ratios)
latentkv convert --rope-dim 96 --kv-rank 240 --out old_default --eval-tokens 0
for m in default old_default; do
  latentkv bench decode --model $m --threads 2 --contexts 128 4096 --weights none w4a8 --kv-cache-dtypes int8_rope8 \
      --out dec_$m > decode/decode-$m.txt
done
