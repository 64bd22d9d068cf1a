#!/usr/bin/env bash
# The agent replay (scripts/reference/bench_agent.py) against FastMLX's `serve` (prefix cache in
# RAM and on disk) and mlx-lm's server (batched, f32 + OpenBLAS; its prompt cache is in RAM only):
# a cold ~4.3k-token coding prompt, the next turns, a second conversation with the same system
# prompt, a restart of the server and the next turn, then 16 agents at once on that prompt.
#   scripts/bench_agent.sh [fastmlx|mlx-lm|all]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHICH="${1:-all}"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
PY=.cache/venv/bin/python
PORT=8091
STATE="$(mktemp)"
wait_up() { for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && return; sleep 1; done; echo "server did not start" >&2; return 1; }
agent() { $PY scripts/reference/bench_agent.py --url "http://127.0.0.1:$PORT" --state "$STATE" "$@"; }

if [[ $WHICH != mlx-lm ]]; then
  cargo build --release --locked -q
  CACHE="$(mktemp -d)"
  start() { FASTMLX_CACHE_DIR="$CACHE" ./target/release/fastmlx serve --port $PORT --max-batch 32 >>/tmp/fastmlx-bench-agent.log 2>&1 & pid=$!; wait_up; }
  start
  agent --label "fastmlx serve" --phase before-restart
  kill $pid; wait $pid 2>/dev/null || true
  start
  agent --label "fastmlx serve" --phase after-restart
  agent --label "fastmlx serve" --phase agents
  curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^fastmlx_(prefix_cache_(bytes|disk_bytes|blocks)|kv_cache_bytes)' || true
  kill $pid; wait $pid 2>/dev/null || true
  rm -rf "$CACHE"
fi
if [[ $WHICH != fastmlx ]]; then
  F32=.cache/models/SmolLM2-135M-Instruct-mlx-f32
  [[ -f "$F32/.ok" ]] || { $PY scripts/reference/export_mlx_model.py --f32 "$F32" >/dev/null && touch "$F32/.ok"; }
  start() {
    LD_PRELOAD=libopenblas.so.0 $PY -m mlx_lm.server --model "$F32" --port $PORT --decode-concurrency 32 --prompt-concurrency 32 \
      >>/tmp/fastmlx-bench-agent-mlx.log 2>&1 & pid=$!; wait_up
  }
  start
  agent --label "mlx-lm f32+OpenBLAS" --phase before-restart --model "$F32"
  kill $pid; wait $pid 2>/dev/null || true
  start
  agent --label "mlx-lm f32+OpenBLAS" --phase after-restart --model "$F32"
  agent --label "mlx-lm f32+OpenBLAS" --phase agents --model "$F32"
  kill $pid; wait $pid 2>/dev/null || true
fi
rm -f "$STATE"
