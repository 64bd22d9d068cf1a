#!/usr/bin/env bash
# Servers under the same concurrent HTTP load (streaming /v1/completions, EOS banned with
# logit_bias so every request generates --gen-tokens): FastMLX's `serve`, and mlx-lm's own server
# (batched mode) on the f32 export with OpenBLAS preloaded and on the 4-bit export.
#   scripts/bench_server.sh [fastmlx|mlx-lm|all] [--concurrency 1,16] [--prompt-words 100] [--gen-tokens 128]
#   scripts/bench_server.sh [fastmlx|mlx-lm|all] --case long-arrival|interactive [--long-words 1500]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHICH=all
case "${1:-}" in fastmlx|mlx-lm|all) WHICH="$1"; shift ;; esac
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
PY=.cache/venv/bin/python
PORT=8090
BENCH_ARGS=("$@")
wait_up() { for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && return; sleep 1; done; echo "server did not start" >&2; return 1; }
bench() { $PY scripts/reference/bench_server.py --url "http://127.0.0.1:$PORT" --label "$1" "${BENCH_ARGS[@]}" || true; }

if [[ $WHICH != mlx-lm ]]; then
  cargo build --release --locked -q
  ./target/release/fastmlx serve --port $PORT --max-batch 32 >/tmp/fastmlx-bench-server.log 2>&1 &
  pid=$!
  wait_up && bench "fastmlx serve"
  kill $pid; wait $pid 2>/dev/null || true
fi
if [[ $WHICH != fastmlx ]]; then
  F32=.cache/models/SmolLM2-135M-Instruct-mlx-f32
  [[ -f "$F32/.ok" ]] || { $PY scripts/reference/export_mlx_model.py --f32 "$F32" >/dev/null && touch "$F32/.ok"; }
  run() { # label, model dir, extra env
    local label="$1" model="$2"; shift 2
    env "$@" $PY -m mlx_lm.server --model "$model" --port $PORT --decode-concurrency 32 --prompt-concurrency 32 \
      >/tmp/fastmlx-bench-mlx-server.log 2>&1 &
    local pid=$!
    wait_up && bench "$label"
    kill $pid; wait $pid 2>/dev/null || true
  }
  run "mlx-lm f32+OpenBLAS" "$F32" LD_PRELOAD=libopenblas.so.0
  run "mlx-lm 4-bit" .cache/models/SmolLM2-135M-Instruct-mlx-4bit X=1
fi
