#!/bin/bash
# The AMX Xeon quiet-window run of session 24 (grouped rope keys and no zero nope part in the prefill):
# session 22's script with the prefill timed over three prompts a context. `bench decode` then ran once
# more alone with the same arguments (timing.txt; run1/ holds the first).
cd "$(dirname "$0")/../.."
OUT=docs/bench-amx-s24 DECODE_EXTRA="--prefill-repeats 3" bash docs/bench-amx-s22/run.sh
