#!/usr/bin/env bash
# The memory governor under a storm (issue 31): 12 concurrent unique ~1.6k-token prompts to
# `fastmlx serve` on the default model (SmolLM2), with no ceiling and with `--memory-limit`:
# resident memory before, at its peak and 15 s after, requests answered or refused, throughput.
#   scripts/bench_memory.sh [--limit 1.1GB] [--requests 12] [--prompt-tokens 1600] [--gen-tokens 32]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LIMIT=1.1GB
ARGS=()
while (($#)); do
  case "$1" in
    --limit) LIMIT="$2"; shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
PY=.cache/venv/bin/python
PORT=8091
BIN=${FASTMLX_BIN:-}
if [[ -z "$BIN" ]]; then
  cargo build --release --locked -q
  BIN=./target/release/fastmlx
fi
wait_up() { for _ in $(seq 180); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && return; sleep 1; done; echo "server did not start" >&2; return 1; }
run() { # label, serve flags...
  local label="$1"; shift
  "$BIN" serve --port $PORT --max-batch 16 "$@" >/tmp/fastmlx-bench-memory.log 2>&1 &
  local pid=$!
  wait_up && $PY scripts/reference/bench_memory.py --url "http://127.0.0.1:$PORT" --pid $pid --label "$label" "${ARGS[@]}" || true
  curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^fastmlx_(memory_(ceiling|prediction_worst|prefill_narrowed|prefill_deferred)|requests_(parked|refused))' || true
  kill $pid; wait $pid 2>/dev/null || true
}
run "no ceiling" --memory-limit 100%
run "--memory-limit $LIMIT" --memory-limit "$LIMIT"
