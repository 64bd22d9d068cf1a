#!/usr/bin/env bash
# Windowed layers over long prompts: a small random Gemma 3 (12 layers, 10 local with a 512-token
# window, 2 global; scripts/reference/make_bench_models.py, mlx-lm's classes, f32) served by
# FastMLX as it is and with the window made longer than the context (every layer keeps every
# token: what FastMLX held before it dropped keys), and by mlx-lm's batched server (rotating
# caches) on the same weights. Long prompts over HTTP (scripts/reference/bench_server.py, EOS
# banned); FastMLX's KV figures from its /metrics after each run.
#   scripts/bench_window.sh [--concurrency 1,4] [--prompt-words 3000] [--gen-tokens 128]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
PY=.cache/venv/bin/python
PORT=8092
MODELS=.cache/models/bench
BENCH_ARGS=(--concurrency 1,4 --prompt-words 3000 --gen-tokens 128 "$@")
MODEL=$MODELS/gemma3-window-bench
[[ -f $MODEL/.ok ]] || { $PY scripts/reference/make_bench_models.py $MODELS gemma3-window-bench && touch $MODEL/.ok; }
# The same weights, every layer's window longer than any prompt here.
FULL=$MODELS/gemma3-window-bench-full
mkdir -p "$FULL"
for f in "$MODEL"/*; do ln -sf "$(realpath "$f")" "$FULL/"; done
rm -f "$FULL/config.json"
$PY -c "import json,sys; c=json.load(open(sys.argv[1])); c['sliding_window']=65536; json.dump(c,open(sys.argv[2],'w'))" \
  "$MODEL/config.json" "$FULL/config.json"
cargo build --release --locked -q
echo "machine: $(uname -sm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
wait_up() { for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && return; sleep 1; done; echo "server did not start" >&2; return 1; }
bench() { $PY scripts/reference/bench_server.py --url "http://127.0.0.1:$PORT" --label "$1" "${BENCH_ARGS[@]}" --ban 0 2 || true; }
kv() { curl -sf "http://127.0.0.1:$PORT/metrics" | grep -E '^fastmlx_(kv_cache_peak_bytes|mlx_peak_bytes)[{ ]' | sed "s/^/  $1 /"; }
for model in "$MODEL" "$FULL"; do
  ./target/release/fastmlx serve --model "$model" --port $PORT --max-batch 32 --no-prefix-cache \
    >/tmp/fastmlx-bench-window.log 2>&1 &
  pid=$!
  wait_up && bench "fastmlx $(basename "$model")" && kv "$(basename "$model")"
  kill $pid; wait $pid 2>/dev/null || true
done
LD_PRELOAD=libopenblas.so.0 $PY -m mlx_lm.server --model "$MODEL" --port $PORT \
  --decode-concurrency 32 --prompt-concurrency 32 >/tmp/fastmlx-bench-window-mlx.log 2>&1 &
pid=$!
wait_up && bench "mlx-lm gemma3-window-bench"
kill $pid; wait $pid 2>/dev/null || true
