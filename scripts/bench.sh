#!/usr/bin/env bash
# Single-stream speed of FastMLX and of mlx-lm on the same models, machine and prompts, one
# after the other. Arguments go to both: e.g. --prompt-tokens 512 --gen-tokens 128 --runs 3.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
cargo build --locked --release --quiet
echo "machine: $(uname -sm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
# FastMLX's default on a CPU (quantized weights expanded to f32), then MLX's quantized kernels.
./target/release/fastmlx bench "$@"
FASTMLX_WEIGHTS=packed ./target/release/fastmlx bench "$@"
FASTMLX_WEIGHTS=packed ./target/release/fastmlx bench -m .cache/models/SmolLM2-135M-Instruct-mlx-4bit "$@"
.cache/venv/bin/python scripts/reference/bench_mlx_lm.py "$@"
