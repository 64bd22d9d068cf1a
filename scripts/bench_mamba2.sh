#!/usr/bin/env bash
# A Mamba-2 hybrid against mlx-lm on the same weights: a small random Nemotron-H (8 layers, 6
# Mamba-2 of 16 heads x 64 with state 64, 2 attention, hidden 512, ReLU² MLPs). See
# scripts/bench_vs_mlx_lm.sh.
#   scripts/bench_mamba2.sh [fastmlx|mlx-lm|all]
exec "$(dirname "${BASH_SOURCE[0]}")/bench_vs_mlx_lm.sh" nemotron-h-mamba2-bench mamba2 "${1:-all}"
