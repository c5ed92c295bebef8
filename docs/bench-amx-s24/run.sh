#!/bin/bash
# The AMX Xeon quiet-window run of session 24 (the query projection folded to the un-mixed rope query,
# one kv row per group of heads in the prefill): session 22's script with the prefill timed over three
# prompts a context, as session 23 ran it.
cd "$(dirname "$0")/../.."
OUT=docs/bench-amx-s24 DECODE_EXTRA="--prefill-repeats 3" bash docs/bench-amx-s22/run.sh
