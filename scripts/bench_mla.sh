#!/usr/bin/env bash
# Multi-head latent attention against mlx-lm on the same weights: a small random DeepSeek-V3 (8
# dense layers, hidden 512, 8 heads, latent 256 + rotary 32 cached per token and layer). See
# scripts/bench_vs_mlx_lm.sh.
#   scripts/bench_mla.sh [fastmlx|mlx-lm|all]
exec "$(dirname "${BASH_SOURCE[0]}")/bench_vs_mlx_lm.sh" deepseek-v3-mla-bench mla "${1:-all}"
