#!/usr/bin/env bash
# KV-cache quantization on SmolLM2 (f32 compute, quantized weights expanded, as FastMLX runs it on a
# CPU by default): KV bytes, TTFT and decode speed at 4k and 16k tokens of context with the KV cache
# at full precision, 8 and 4 bits, FastMLX (`fastmlx bench --kv-bits`) then mlx-lm
# (`QuantizedKVCache` from the first token) with the same bits, one after the other.
#   scripts/bench_kv.sh [--gen-tokens 64] [--runs 1]
# FASTMLX_BIN=./target/debug/fastmlx uses the test build (MLX itself is the release wheel's library
# either way; only FastMLX's own code is less optimised) instead of building the release binary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
BIN=${FASTMLX_BIN:-./target/release/fastmlx}
[[ $BIN == ./target/release/fastmlx ]] && cargo build --locked --release --quiet
ARGS=(--gen-tokens 64 --runs 1 "$@")
# KV_START=N quantizes from position N on; KV_START=prompt from the prompt's length (a full-precision
# prefill, then a quantized decode): on a CPU, where quantized attention is MLX's single-threaded
# quantized_matmul, a prefill quantized from the first token takes many minutes at 4k tokens.
START=${KV_START:-0}
echo "machine: $(uname -sm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
# CONTEXTS="4096" runs one length only (16k takes about an hour on 2 CPU cores: six 16k prefills).
for ctx in ${CONTEXTS:-4096 16384}; do
  for bits in 0 8 4; do
    # SmolLM2 was trained on 8192 tokens: 16k is a benchmark's context only (both servers run it).
    start=$START; [[ $start == prompt ]] && start=$ctx
    "$BIN" bench --prompt-tokens "$ctx" --context 20000 --kv-bits "$bits" --kv-start "$start" "${ARGS[@]}"
    .cache/venv/bin/python scripts/reference/bench_mlx_lm.py --skip-packed --prompt-tokens "$ctx" --kv-bits "$bits" \
      --kv-start "$start" "${ARGS[@]}"
  done
done
