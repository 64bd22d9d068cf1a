#!/usr/bin/env bash
# Mixture-of-experts decode speed, FastMLX against mlx-lm's server on the same weights: a small
# random Qwen3-MoE (32 experts, 4 per token) and a dense Qwen3 of the same active size (what the
# routing costs), built with mlx-lm's own classes (scripts/reference/make_bench_models.py), f32.
# Both servers over HTTP under the same load (scripts/reference/bench_server.py, EOS banned);
# mlx-lm batched (--decode-concurrency 32 --prompt-concurrency 32), OpenBLAS preloaded.
#   scripts/bench_moe.sh [--concurrency 1,8] [--prompt-words 100] [--gen-tokens 128]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
PY=.cache/venv/bin/python
PORT=8091
MODELS=.cache/models/bench
BENCH_ARGS=(--concurrency 1,8 "$@")
[[ -f $MODELS/.ok ]] || { $PY scripts/reference/make_bench_models.py $MODELS && touch $MODELS/.ok; }
cargo build --release --locked -q
echo "machine: $(uname -sm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
wait_up() { for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && return; sleep 1; done; echo "server did not start" >&2; return 1; }
bench() { $PY scripts/reference/bench_server.py --url "http://127.0.0.1:$PORT" --label "$1" "${BENCH_ARGS[@]}" --ban 0 2 || true; }
for model in qwen3-moe-bench qwen3-dense-bench; do
  ./target/release/fastmlx serve --model "$MODELS/$model" --port $PORT --max-batch 32 >/tmp/fastmlx-bench-moe.log 2>&1 &
  pid=$!
  wait_up && bench "fastmlx $model"
  kill $pid; wait $pid 2>/dev/null || true
  LD_PRELOAD=libopenblas.so.0 $PY -m mlx_lm.server --model "$MODELS/$model" --port $PORT \
    --decode-concurrency 32 --prompt-concurrency 32 >/tmp/fastmlx-bench-moe-mlx.log 2>&1 &
  pid=$!
  wait_up && bench "mlx-lm $model"
  kill $pid; wait $pid 2>/dev/null || true
done
