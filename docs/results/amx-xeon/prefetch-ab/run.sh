#!/usr/bin/env bash
# A/B of the AMX decode with and without software prefetch of a bf16 cache's rows (2026-12-07, Intel Xeon
# with AMX, 1 thread a call, nothing else running): the parent commit's checkout (A) against this one (B),
# alternating, two rounds; output: ab.txt. A and B: paths of the two checkouts, each with its own
# LATENTKV_BUILD_DIR.
set -euo pipefail
grep -m1 flags /proc/cpuinfo > cpuflags.txt
for round in 1 2; do
  for side in A B; do
    dir=${!side}
    for shape in "32 4096 16 512 64" "32 1024 9 192 192" "1 4096 16 512 64" "32 256 16 512 64"; do
      echo -n "$side: "; (cd "$dir" && PYTHONPATH="$dir" python "$OLDPWD/attbench.py" $shape auto 3)
    done
  done
done | tee ab.txt
