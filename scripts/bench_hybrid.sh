#!/usr/bin/env bash
# A linear-attention hybrid against mlx-lm on the same weights: a small random Qwen3.5-style model
# (8 layers: 6 Gated DeltaNet, 2 gated attention; hidden 512). See scripts/bench_vs_mlx_lm.sh.
#   scripts/bench_hybrid.sh [fastmlx|mlx-lm|all]
exec "$(dirname "${BASH_SOURCE[0]}")/bench_vs_mlx_lm.sh" qwen3_5-hybrid-bench hybrid "${1:-all}"
