#!/usr/bin/env bash
# mlx-lm's own server (batched mode) under the same concurrent load as `fastmlx bench
# --concurrency`, on the 4-bit MLX export and on the f32 export with OpenBLAS preloaded.
#   scripts/bench_server.sh [--concurrency 1,16] [--prompt-words 100] [--gen-tokens 128]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
PY=.cache/venv/bin/python
F32=.cache/models/SmolLM2-135M-Instruct-mlx-f32
[[ -f "$F32/.ok" ]] || { $PY scripts/reference/export_mlx_model.py --f32 "$F32" >/dev/null && touch "$F32/.ok"; }
PORT=8090
run() { # label, model dir, extra env
  local label="$1" model="$2"; shift 2
  env "$@" $PY -m mlx_lm.server --model "$model" --port $PORT --decode-concurrency 32 --prompt-concurrency 32 \
    >/tmp/fastmlx-bench-mlx-server.log 2>&1 &
  local pid=$!
  for _ in $(seq 60); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && break; sleep 1; done
  $PY scripts/reference/bench_server.py --url "http://127.0.0.1:$PORT" --label "$label" "${BENCH_ARGS[@]}" || true
  kill $pid; wait $pid 2>/dev/null || true
}
BENCH_ARGS=("$@")
run "mlx-lm f32+OpenBLAS" "$F32" LD_PRELOAD=libopenblas.so.0
run "mlx-lm 4-bit" .cache/models/SmolLM2-135M-Instruct-mlx-4bit X=1
