#!/usr/bin/env bash
# The transform-coded cache healed in the loop (issue item 5), 2026-12-07, Intel Xeon (AMX), 2 threads,
# nothing else running during each heal. The conversions are `convert --kv-bytes` end to end at rope "all"
# (the transform-coded candidates only, as `bench frontier` converts); each heal trains the attention
# weights for 30 minutes (default settings: lr 3e-5, 256-token windows, batch 4, half chat / half
# documents, bf16 autocast) with the latent and rope key read through the folder's codes
# (straight-through). Measured as ../xeon-tc2 measured its rows: 24 held-out chat prompts, 1,024 tokens of
# perplexity a domain.
set -euo pipefail
grep -m1 flags /proc/cpuinfo > cpuflags.txt
latentkv convert --kv-bytes 2880 --kv-formats transform_code --kv-rope-dims all --eval-tokens 0 --out kv2880
latentkv convert --kv-bytes 5760 --kv-formats transform_code --kv-rope-dims all --eval-tokens 0 --out kv5760
latentkv heal kv2880 --minutes 30 --eval-examples 0 --out kv2880-healed     # -> heal2880-loss.png
latentkv heal kv5760 --minutes 30 --eval-examples 0 --out kv5760-healed     # -> heal5760-loss.png
python judge.py 2 kv2880 kv2880-healed kv5760 kv5760-healed > judge.jsonl
python plot.py                                                             # -> frontier-heal.png
# Longer, 2026-12-07 (commit 6079991): the 25% folder's heal continued from kv5760-healed. At lr 1e-4 the training
# KL rose from 0.024 to 0.06-0.08 within 140 steps, so that run was stopped; at the default rate, 25 minutes more
# (341 steps, KL 0.0236 -> 0.0226):
latentkv heal kv5760-healed --minutes 25 --eval-examples 0 --out kv5760-healed2
python judge.py 2 kv5760-healed2 > judge-continued.jsonl

