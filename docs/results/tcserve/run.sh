#!/bin/sh
# A transform-coded folder of the bundled SmolLM2 at a quarter of its f16 KV cache, served by the engine
# (reference attention backend over the coded paged cache) against the simulated reference.
# Measured 2026-12-06, code at commit be98b11, Intel Xeon (AMX, 2 cores, shared: quality figures only).
set -e
latentkv convert --kv-bytes 5760 --kv-formats transform_code --kv-rope-dims all --eval-tokens 0 --out kv5760 \
    2>&1 | grep "latentkv convert" > convert5760.txt     # chose rope 192 + rank 192, sides: 5749 B/token
latentkv generate kv5760 --chat --prompt "What is the capital of France?" --max-tokens 24   # end to end
python served_vs_simulated.py kv5760 8 48 > served_vs_simulated.jsonl
python noise.py kv5760 > noise.txt
