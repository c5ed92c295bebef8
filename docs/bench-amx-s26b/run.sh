#!/bin/bash
# Session 26's second AMX Xeon run, at the end of the session (the residual adds in the norms, the AMX
# linears' weights prefetched as they stream, the merge per ISA): session 22's script with the prefill
# timed over three prompts a context.
cd "$(dirname "$0")/../.."
OUT=docs/bench-amx-s26b DECODE_EXTRA="--prefill-repeats 3" bash docs/bench-amx-s22/run.sh
