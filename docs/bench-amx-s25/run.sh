#!/bin/bash
# The AMX Xeon quiet-window run of session 25 (the AMX decode kernel: rows widened a tile ahead, int8
# rope codes widened as codes, score chains in turns, queries packed by transposes and not zeroed):
# session 22's script with the prefill timed over three prompts a context, as sessions 23-24 ran it.
cd "$(dirname "$0")/../.."
OUT=docs/bench-amx-s25 DECODE_EXTRA="--prefill-repeats 3" bash docs/bench-amx-s22/run.sh
