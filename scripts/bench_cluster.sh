#!/usr/bin/env bash
# Pipeline parallel on one machine (issue 38): SmolLM2-135M (the default model) generating alone,
# then split across 2 processes on loopback with MLX's ring backend (`fastmlx generate
# --cluster`), one after the other. Two processes share this machine's cores, so no speed-up is
# expected: what it shows is the cost of the split (bytes per token per hop, the time rank 0
# waits for the other rank each step) and the prefill and decode speeds of 1 and 2 processes.
#   scripts/bench_cluster.sh [PROMPT_WORDS] [GEN_TOKENS]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORDS="${1:-400}"
GEN="${2:-128}"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
cargo build --release --locked -q
BIN=./target/release/fastmlx
MODEL=.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
echo "machine: $(uname -sm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
PROMPT="$(python3 -c "import sys; print(' '.join(['the quick brown fox jumps over the lazy dog'] * (int(sys.argv[1]) // 9 + 1)))" "$WORDS")"
ARGS=(generate --model "$MODEL" --prompt "$PROMPT" --max-tokens "$GEN" --ignore-eos)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "== 1 process"
$BIN "${ARGS[@]}" 2>&1 >/dev/null | grep -E '^(Prompt|Generation|Peak)'

echo "== 2 processes (ring backend, loopback)"
HOSTS="$(mktemp)"
echo "[[\"127.0.0.1:$(free_port)\"], [\"127.0.0.1:$(free_port)\"]]" >"$HOSTS"
LOG1="$(mktemp)"
$BIN "${ARGS[@]}" --cluster "$HOSTS" --rank 0 2>&1 >/dev/null | grep -E '^(rank|Prompt|Generation|Peak|Pipeline)' &
R0=$!
sleep 0.5
$BIN "${ARGS[@]}" --cluster "$HOSTS" --rank 1 >"$LOG1" 2>&1 &
R1=$!
wait $R0
wait $R1
grep -E '^rank' "$LOG1"
echo "== the ring's link, measured by the preflight"
echo "[[\"127.0.0.1:$(free_port)\"], [\"127.0.0.1:$(free_port)\"]]" >"$HOSTS"
$BIN cluster check --hostfile "$HOSTS" --rank 0 --model "$MODEL" | grep link &
C0=$!
sleep 0.5
$BIN cluster check --hostfile "$HOSTS" --rank 1 --model "$MODEL" >/dev/null
wait $C0
rm -f "$HOSTS" "$LOG1"
