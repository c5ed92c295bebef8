#!/bin/bash
# The AMX Xeon quiet-window run of session 17: session 15's commands, output in this folder.
OUT=docs/bench-amx-s17 exec bash "$(dirname "$0")/../bench-amx-s15/run.sh"
