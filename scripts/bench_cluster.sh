#!/usr/bin/env bash
# A cluster on one machine (issue 38): a model generating alone, then split across 2 processes on
# loopback with MLX's ring backend (`fastmlx generate --cluster`), by pipeline stages and by
# tensors, one run after the other: SmolLM2-135M (the default model; its 9 heads do not split in
# two, so by pipeline only) and the dense Qwen3 bench model (scripts/reference/make_bench_models.py:
# 8 layers, hidden 512, 8 heads, f32). Two processes share this machine's
# cores, so no speed-up is expected: what it shows is the cost of the split (bytes per token per
# hop, the time rank 0 waits for the other rank each step) and the prefill and decode speeds.
# Each process of the split runs one BLAS thread (one core each, as two machines would have
# their own); the single process is timed with all cores and with one. Then the server (`serve
# --cluster`): one long prompt (prefill) and 8 concurrent requests (decode at batch 8), alone and
# across 2 processes, with the cluster's per-step figures from /admin/status: SmolLM2 by pipeline
# with each prefill step sent whole and in parts, the Qwen3 bench model by tensors. THREE=1: only
# SmolLM2 served alone and across 3 processes, prefill steps whole, in parts with one part out
# at a time (FASTMLX_CLUSTER_WINDOW=1: the others' stages in turn) and in parts with one out per
# other rank (the default).
#   [SERVE_ONLY=1 | THREE=1] scripts/bench_cluster.sh [PROMPT_WORDS] [GEN_TOKENS]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORDS="${1:-400}"
GEN="${2:-128}"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
cargo build --release --locked -q
BIN=./target/release/fastmlx
BENCH=.cache/models/bench/qwen3-dense-bench
[[ -f $BENCH/.ok ]] || { .cache/venv/bin/python scripts/reference/make_bench_models.py .cache/models/bench qwen3-dense-bench && touch $BENCH/.ok; }
echo "machine: $(uname -sm), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | xargs)"
PROMPT="$(python3 -c "import sys; print(' '.join(['the quick brown fox jumps over the lazy dog'] * (int(sys.argv[1]) // 9 + 1)))" "$WORDS")"

ONE_THREAD=(env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HOSTS="$(mktemp)"
LOG0="$(mktemp)"
LOG1="$(mktemp)"
RANKS=2
new_hosts() { # the host file of $RANKS ranks on loopback
  local list=""
  for _ in $(seq "$RANKS"); do list="$list${list:+, }[\"127.0.0.1:$(free_port)\"]"; done
  echo "[$list]" >"$HOSTS"
}
REPORT='^(rank|Prompt|Generation|Peak|Pipeline|Sums)'

split() { # split MODEL PARALLEL
  echo "== 2 processes by $2, one BLAS thread each (ring backend, loopback)"
  new_hosts
  "${ONE_THREAD[@]}" $BIN "${ARGS[@]}" --cluster "$HOSTS" --rank 0 --parallel "$2" >/dev/null 2>"$LOG0" &
  local r0=$!
  sleep 0.5
  "${ONE_THREAD[@]}" $BIN "${ARGS[@]}" --cluster "$HOSTS" --rank 1 --parallel "$2" >/dev/null 2>"$LOG1" || true
  wait $r0 || true
  grep -hE "$REPORT|error" "$LOG0" "$LOG1" || true
}
# SERVE_ONLY=1: the servers only.
for MODEL in $([[ -n ${SERVE_ONLY:-}${THREE:-} ]] || echo .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf "$BENCH"); do
  echo "######## $(basename "$MODEL")"
  ARGS=(generate --model "$MODEL" --prompt "$PROMPT" --max-tokens "$GEN" --ignore-eos)
  echo "== 1 process, every core"
  $BIN "${ARGS[@]}" 2>&1 >/dev/null | grep -E "$REPORT"
  echo "== 1 process, one BLAS thread"
  "${ONE_THREAD[@]}" $BIN "${ARGS[@]}" 2>&1 >/dev/null | grep -E "$REPORT"
  split "$MODEL" pipeline
  split "$MODEL" tensor
done
# mlx-lm's own split of the same model (the peer: `mlx.launch` starting `mlx_lm.benchmark` on 2
# ranks of the ring backend, by tensors: mlx-lm pipelines only the families that declare it, not
# Qwen3), the prompt random tokens of the same length, one BLAS thread per process.
if [[ -z ${SERVE_ONLY:-}${THREE:-} ]]; then
  TOKENS=$($BIN generate --model "$BENCH" --prompt "$PROMPT" --max-tokens 1 2>&1 >/dev/null | sed -n 's/^Prompt: \([0-9]*\) tokens.*/\1/p')
  MLXLM=(-m mlx_lm.benchmark --model "$ROOT/$BENCH" -p "$TOKENS" -g "$GEN" -n 3)
  echo "######## mlx-lm $(.cache/venv/bin/python -c 'import mlx_lm; print(mlx_lm.__version__)'): $(basename "$BENCH")"
  echo "== 1 process, one BLAS thread"
  "${ONE_THREAD[@]}" .cache/venv/bin/python "${MLXLM[@]}" 2>&1 | grep Averages
  echo "== 2 processes by tensors (mlx.launch, ring backend, loopback), one BLAS thread each"
  .cache/venv/bin/mlx.launch --backend ring --hosts 127.0.0.1 -n 2 --env OPENBLAS_NUM_THREADS=1 --env OMP_NUM_THREADS=1 \
    -- "$ROOT/.cache/venv/bin/python" "${MLXLM[@]}" 2>&1 | grep Averages
fi
# serve_load PORT: one long prompt, then 8 at once; prints prefill and decode speeds and, for a
# cluster, its steps' costs.
serve_load() {
  python3 - "$1" "$PROMPT" "$GEN" <<'PY'
import json, sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
port, prompt, gen = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
url = f"http://127.0.0.1:{port}"
def post(body):
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=600))
def status():
    return json.load(urllib.request.urlopen(f"{url}/admin/status"))["loaded"][0].get("cluster")
one = post({"prompt": prompt, "max_tokens": 1, "temperature": 0})
print(f"prefill: {one['usage']['prompt_tokens']} tokens at {one['timings']['prompt_per_second']:.0f} tok/s")
before = status()
asks = [{"prompt": f"{i}: {prompt[:200]}", "max_tokens": gen, "temperature": 0, "ignore_eos": True} for i in range(8)]
started = time.time()
with ThreadPoolExecutor(8) as pool:
    done = list(pool.map(post, asks))
took = time.time() - started
tokens = sum(d["usage"]["completion_tokens"] for d in done)
print(f"8 concurrent requests: {tokens} tokens in {took:.2f} s, {tokens / took:.1f} tok/s together")
after = status()
if after:
    steps = after["steps"] - before["steps"]
    per = lambda k: (after[k] - before[k]) / max(steps, 1)
    print(f"{after.get('parallel', 'pipeline')} over those: {steps} steps, {per('tokens'):.1f} positions and "
          f"{per('bytes_per_hop'):.0f} bytes per hop per step, step {per('step_seconds') * 1e3:.2f} ms of which rank 0 "
          f"waited {per('wait_seconds') * 1e3:.2f} ms for the other rank (its layers and the hops, or the sums)")
    for kind in ("prompt", "decode"):
        a, b = after["sums_timed"][kind], before["sums_timed"][kind]
        timed = a["steps"] - b["steps"]
        if timed:
            sums = (a["sum_seconds"] - b["sum_seconds"]) / timed
            whole = (a["step_seconds"] - b["step_seconds"]) / timed
            print(f"the sums of {kind} steps, timed apart from the layers on {timed} of those steps: "
                  f"{sums * 1e3:.2f} ms of a {whole * 1e3:.2f} ms timed step")
PY
}
wait_health() { for _ in $(seq 240); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.5; done; echo "server on $1 not ready" >&2; return 1; }
SMOL=.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
SERVE_DIR="$(mktemp -d)"
SERVE=(env FASTMLX_CACHE_DIR="$SERVE_DIR/cache" FASTMLX_MODELS_DIR="$SERVE_DIR/models" OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1)
serve_alone() { # serve_alone MODEL
  echo "== 1 process, one BLAS thread"
  PORT=$(free_port)
  "${SERVE[@]}" $BIN serve --model "$1" --port "$PORT" --no-prefix-cache 2>"$LOG0" &
  S0=$!
  wait_health "$PORT" && serve_load "$PORT"
  kill $S0; wait $S0 2>/dev/null || true
}
serve_split() { # serve_split MODEL LABEL [ENV=VALUE...] -- [serve flags...]
  local model="$1" label="$2" env=() flags=()
  shift 2
  while [[ $# -gt 0 && $1 != -- ]]; do env+=("$1"); shift; done
  [[ $# -gt 0 ]] && shift
  flags=("$@")
  echo "== $RANKS processes $label, one BLAS thread each (ring backend, loopback)"
  new_hosts
  PORT=$(free_port)
  "${SERVE[@]}" "${env[@]}" $BIN serve --model "$model" --port "$PORT" --no-prefix-cache --cluster "$HOSTS" --rank 0 "${flags[@]}" 2>"$LOG0" &
  local pids=($!)
  for rank in $(seq 1 $((RANKS - 1))); do
    sleep 0.5
    "${SERVE[@]}" "${env[@]}" $BIN serve --model "$model" --port "$(free_port)" --no-prefix-cache --cluster "$HOSTS" --rank "$rank" "${flags[@]}" 2>"$LOG1" &
    pids+=($!)
  done
  wait_health "$PORT" && serve_load "$PORT"
  kill "${pids[0]}"; wait "${pids[@]}" 2>/dev/null || true
}
if [[ -n ${THREE:-} ]]; then
  echo "######## serve: $(basename "$SMOL"), prefix cache off, 3 processes"
  serve_alone "$SMOL"
  RANKS=3
  serve_split "$SMOL" "by pipeline, prefill steps whole" FASTMLX_CLUSTER_PARTS=1 --
  serve_split "$SMOL" "by pipeline, prefill steps in parts, one out at a time" FASTMLX_CLUSTER_WINDOW=1 --
  serve_split "$SMOL" "by pipeline, prefill steps in parts, one out per other rank (the default)" --
  rm -rf "$SERVE_DIR" "$HOSTS" "$LOG0" "$LOG1"
  exit 0
fi
echo "######## serve: $(basename "$SMOL"), prefix cache off"
serve_alone "$SMOL"
# FASTMLX_CLUSTER_PARTS=1: each prefill step goes down the pipeline whole (the machines in turn).
serve_split "$SMOL" "by pipeline, prefill steps whole" FASTMLX_CLUSTER_PARTS=1 --
serve_split "$SMOL" "by pipeline, prefill steps in parts (the default)" --
echo "######## serve: $(basename "$BENCH"), prefix cache off"
serve_alone "$BENCH"
serve_split "$BENCH" "by tensors" -- --parallel tensor
rm -rf "$SERVE_DIR"
echo "== the ring's link, measured by the preflight"
new_hosts
$BIN cluster check --hostfile "$HOSTS" --rank 0 --model "$BENCH" | grep link &
C0=$!
sleep 0.5
$BIN cluster check --hostfile "$HOSTS" --rank 1 --model "$BENCH" >/dev/null
wait $C0
rm -f "$HOSTS" "$LOG0" "$LOG1"
