#!/bin/bash
# The AMX Xeon quiet-window run of session 28 (the vectorized cache write and rope rows, a step's
# prompts through the prefill kernel together, its native last step): session 22's script with the
# prefill timed over three prompts a context, as sessions 23-26 ran it.
cd "$(dirname "$0")/../.."
OUT=docs/bench-amx-s28 DECODE_EXTRA="--prefill-repeats 3" bash docs/bench-amx-s22/run.sh
