#!/usr/bin/env bash
# The transform-coded allocations measured (2026-12-06): Intel Xeon (AMX), quality only, no timings.
# The machine was shared (load average 6-12 on 2 cores): 24 of the 86 held-out chat prompts, 1,024
# tokens of perplexity per domain (2 windows of 512), float32 only, 1 thread per process.
# Every script builds the conversion convert --kv-bytes builds for its transform-coded candidates at
# rope "all" (common.py), from one calibration saved by calib.py (stats.safetensors, not kept here).
set -euo pipefail
grep -m1 flags /proc/cpuinfo > cpuflags.txt
python calib.py                                                  # the calibration (16,384 tokens)
# agreement (and KL) on the 24 prompts: -> agreement.jsonl (the rows as printed)
python floor.py 24 5760,2880 uniform,sides,global                # not centred
python floor.py 24 5760,2880 uniform_c,sides_c                   # centred (_c)
python floor.py 24 4320,8640 sides_c,uniform_c
python floor.py 24 5760,2880,11520 global_c
python split.py 24 5760 0.35,0.6,0.7                             # K / V balance (stopped after 0.6)
python measured.py 24 5760,2880                                  # sensitivity-weighted (stopped after 5760) -> kls5760.json
# agreement and perplexity: -> rows.jsonl
python rows.py rows.jsonl 5760:sides_c 2880:sides_c 5760:uniform_c 2880:uniform_c
python rows.py rows.jsonl 4320:sides_c 8640:sides_c 4320:uniform_c 8640:uniform_c 11520:sides_c
python conv.py                                                   # convert --kv-bytes 5760 end to end -> conv5760.txt (its log's choice lines)
# the whole frontier on a quiet machine (all 86 prompts, 8,192 tokens a domain, float32 and bf16):
#   latentkv bench frontier --systems llama.cpp reference kivi latentkv --kv-formats transform_code --kv-rope-dims all
