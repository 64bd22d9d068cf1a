#!/usr/bin/env bash
# One bench model (scripts/reference/make_bench_models.py: random weights, mlx-lm's classes, f32)
# against mlx-lm's server on the same weights: decode speed at concurrency 1 and 8
# (scripts/reference/bench_server.py, EOS banned), then the agent replay
# (scripts/reference/bench_agent.py: a cold ~4.3k-token prompt, the next turns, a second
# conversation with the same system prompt, and the next turn after a restart of the server:
# FastMLX's disk tier in a temporary folder). mlx-lm batched (--decode-concurrency 32
# --prompt-concurrency 32), OpenBLAS preloaded. Used by scripts/bench_hybrid.sh and bench_mla.sh.
#   scripts/bench_vs_mlx_lm.sh NAME LABEL [fastmlx|mlx-lm|all]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NAME="$1"
LABEL="$2"
WHICH="${3:-all}"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
PY=.cache/venv/bin/python
PORT=8093
MODELS=.cache/models/bench
MODEL=$MODELS/$NAME
[[ -f $MODEL/.ok ]] || { $PY scripts/reference/make_bench_models.py $MODELS "$NAME" && touch $MODEL/.ok; }
echo "machine: $(uname -sm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
wait_up() { for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && return; sleep 1; done; echo "server did not start" >&2; return 1; }
bench() { $PY scripts/reference/bench_server.py --url "http://127.0.0.1:$PORT" --label "$1" --concurrency 1,8 --prompt-words 100 --gen-tokens 128 --ban 0 2 || true; }
STATE="$(mktemp)"
agent() { $PY scripts/reference/bench_agent.py --url "http://127.0.0.1:$PORT" --state "$STATE" --label "$1" --phase "$2"; }
if [[ $WHICH != mlx-lm ]]; then
  cargo build --release --locked -q
  CACHE="$(mktemp -d)"
  start() {
    FASTMLX_CACHE_DIR="$CACHE" ./target/release/fastmlx serve --model "$MODEL" --port $PORT --max-batch 32 \
      >>/tmp/fastmlx-bench-$LABEL.log 2>&1 &
    pid=$!
    wait_up
  }
  start && bench "fastmlx $LABEL" && agent "fastmlx serve" before-restart
  curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^fastmlx_(prefix_cache_(bytes|blocks|hits|disk_bytes)|kv_cache_peak_bytes)' || true
  kill $pid; wait $pid 2>/dev/null || true
  start && agent "fastmlx serve" after-restart
  kill $pid; wait $pid 2>/dev/null || true
  rm -rf "$CACHE"
fi
if [[ $WHICH != fastmlx ]]; then
  mlx() {
    LD_PRELOAD=libopenblas.so.0 $PY -m mlx_lm.server --model "$MODEL" --port $PORT \
      --decode-concurrency 32 --prompt-concurrency 32 >>/tmp/fastmlx-bench-$LABEL-mlx.log 2>&1 &
    pid=$!
    wait_up
  }
  mlx && bench "mlx-lm $LABEL" && agent "mlx-lm server" before-restart
  kill $pid; wait $pid 2>/dev/null || true
  mlx && agent "mlx-lm server" after-restart
  kill $pid; wait $pid 2>/dev/null || true
fi
rm -f "$STATE"
