#!/usr/bin/env bash
# Images (issue 36), one after the other on a quiet machine: a 1280 x 800 screenshot's time to first
# token on a small random Qwen3-VL-shaped model (scripts/reference/bench_vision.py writes it),
# FastMLX's server (first turn, and the next turn with the image from the prefix cache) against
# mlx-vlm 0.7.6's generate on the same weights (OpenBLAS preloaded, as for mlx-lm).
#   scripts/bench_vision.sh
# FASTMLX_BIN=./target/debug/fastmlx uses the test build instead of building the release binary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
BIN=${FASTMLX_BIN:-./target/release/fastmlx}
[[ $BIN == ./target/release/fastmlx ]] && cargo build --locked --release --quiet
PY=.cache/venv/bin/python
PORT=8092
echo "machine: $(uname -sm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
WORK=$(mktemp -d)
MODEL=$WORK/models/bench-qwen3-vl
$PY scripts/reference/bench_vision.py --case make "$MODEL"
FASTMLX_MODELS_DIR=$WORK/models HF_HUB_CACHE=$WORK LMSTUDIO_MODELS_DIR=$WORK FASTMLX_CACHE_DIR=$WORK/cache \
  "$BIN" serve --port $PORT --model "$MODEL" >/tmp/fastmlx-bench-vision.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && break; sleep 1; done
$PY scripts/reference/bench_vision.py --case fastmlx "http://127.0.0.1:$PORT"
kill $pid; wait $pid 2>/dev/null || true
LD_PRELOAD=libopenblas.so.0 $PY scripts/reference/bench_vision.py --case mlx-vlm "$MODEL"
