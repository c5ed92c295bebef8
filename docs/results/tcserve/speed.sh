#!/bin/sh
# Prefill rate and decode step of the transform-coded folder (kv5760, run.sh) against the default conversion
# (int8_rope8, the same model), each shape twice, alternating: speed.py FOLDER N L. Quiet machine, 2 threads.
# DEFAULT: the default conversion's folder (make serve builds it in the user cache).
set -e
grep -m1 flags /proc/cpuinfo | tr ' ' '\n' | grep -E 'avx|amx|fma' | tr '\n' ' '; echo
for shape in "8 1024" "1 8000" "4 8000"; do
    for round in 1 2; do
        for folder in kv5760 "$DEFAULT"; do
            python speed.py "$folder" $shape 2>/dev/null
        done
    done
done
