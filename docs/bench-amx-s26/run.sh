#!/bin/bash
# The AMX Xeon quiet-window run of session 26 (the AMX decode kernel's int8 path: scores as int8 tile
# products of an int8_rope8 cache's codes in place, the query in two int8 parts): session 22's script
# with the prefill timed over three prompts a context, as sessions 23-25 ran it.
cd "$(dirname "$0")/../.."
OUT=docs/bench-amx-s26 DECODE_EXTRA="--prefill-repeats 3" bash docs/bench-amx-s22/run.sh
