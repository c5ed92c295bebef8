#!/usr/bin/env bash
# A random MHA shape (issue 30): SmolLM2 with 9 KV heads, two of every three random (make_random_mha.py), on the
# frontier at its own q8_0 and q4_0 KV budgets (36,720 and 19,440 B/token). AMD EPYC avx512_bf16, 2 threads.
set -euo pipefail
grep -m1 flags /proc/cpuinfo > cpuflags.txt
python ../../xeon/make_mha.py ~/.cache/latentkv/converted/*-original-hf smollm2-rmha  # made by `bench decode`
python make_random_mha.py smollm2-rmha 3   # the original's 3 KV heads: two of every three made random
python answers_subset.py smollm2-rmha   # its own greedy answers: the 86 held-out and 48 selection prompts (~9 min)
latentkv bench frontier --source smollm2-rmha --systems reference latentkv --budgets 36720 19440 --out frontier \
    --threads 2 | tee frontier.txt
# (the run was stopped after both budgets' selection, before the held-out rows: candidates.txt is its output)
