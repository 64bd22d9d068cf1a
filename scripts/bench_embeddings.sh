#!/usr/bin/env bash
# Embeddings (issue 34), one after the other on a quiet machine: FastMLX's `/v1/embeddings` with
# all-MiniLM-L6-v2 (256 texts: one request, and 8 concurrent ones), mlx-embeddings 0.1.0 in-process on
# the same texts (length-sorted batches of 32, OpenBLAS preloaded), and 8 chat streams' inter-token
# latency with and without a 256-text embedding request beside them.
#   scripts/bench_embeddings.sh [--runs 3]
# FASTMLX_BIN=./target/debug/fastmlx uses the test build instead of building the release binary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
BIN=${FASTMLX_BIN:-./target/release/fastmlx}
[[ $BIN == ./target/release/fastmlx ]] && cargo build --locked --release --quiet
PY=.cache/venv/bin/python
PORT=8091
echo "machine: $(uname -sm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
MODELS=$(mktemp -d)
ln -s "$ROOT/.cache/models/all-MiniLM-L6-v2" "$MODELS/all-MiniLM-L6-v2"
FASTMLX_MODELS_DIR=$MODELS HF_HUB_CACHE=$MODELS LMSTUDIO_MODELS_DIR=$MODELS FASTMLX_CACHE_DIR=$MODELS/cache \
  "$BIN" serve --port $PORT >/tmp/fastmlx-bench-embeddings.log 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$MODELS"' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && break; sleep 1; done
$PY scripts/reference/bench_embeddings.py --case http --url "http://127.0.0.1:$PORT" "$@"
$PY scripts/reference/bench_embeddings.py --case itl --url "http://127.0.0.1:$PORT"
kill $pid; wait $pid 2>/dev/null || true
LD_PRELOAD=libopenblas.so.0 $PY scripts/reference/bench_embeddings.py --case reference "$@"
