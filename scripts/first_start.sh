#!/bin/bash
# Time `make serve`'s first start as a new user meets it: a fresh clone, `make serve` (install,
# conversion of the bundled model into an empty cache, server start), until /health answers.
#   bash scripts/first_start.sh [REPO]     (REPO: a path or URL; default this repository)
set -u
REPO=${1:-$(git -C "$(dirname "$0")" rev-parse --show-toplevel)}
DIR=$(mktemp -d /tmp/latentkv-fresh.XXXX); PORT=${PORT:-8765}
git clone -q "$REPO" "$DIR/repo" && cd "$DIR/repo" || exit 1
export LATENTKV_CACHE_DIR="$DIR/cache"   # nothing converted by earlier runs
start=$(date +%s)
setsid make serve ARGS="--port $PORT" > "$DIR/serve.log" 2>&1 &
pid=$!
until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
  kill -0 $pid 2>/dev/null || { echo "make serve exited; see $DIR/serve.log"; tail -20 "$DIR/serve.log"; exit 1; }
  sleep 1
done
echo "first start: $(( $(date +%s) - start )) s from make serve until /health answered ($DIR/serve.log)"
grep -a "latentkv convert" "$DIR/serve.log"
kill -- -$pid
