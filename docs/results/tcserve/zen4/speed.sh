#!/bin/sh
# The transform-coded folder (kv5760: ../run.sh) against the default conversion (int8_rope8), decode step
# and prefill, one process per shape with the two engines' steps alternating. Quiet machine, 2 threads.
# DEFAULT: the default conversion's folder (make serve builds it in the user cache).
set -e
grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E 'avx|amx|fma' | tr '\n' ' '; echo
for shape in "8 1024" "1 8000" "4 8000"; do
    python speed_ab.py kv5760 "$DEFAULT" $shape 40 2>/dev/null
done
