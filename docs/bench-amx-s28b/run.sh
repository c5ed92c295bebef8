#!/bin/bash
# Session 28's second run, after the rope slots read in place, the prefill state started by the
# kernel and the residual add taken by the next norm: session 22's script, as bench-amx-s28/run.sh.
cd "$(dirname "$0")/../.."
OUT=docs/bench-amx-s28b DECODE_EXTRA="--prefill-repeats 3" bash docs/bench-amx-s22/run.sh
