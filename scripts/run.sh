#!/usr/bin/env bash
# Runs FastMLX after the set-up (idempotent), e.g.
#   scripts/run.sh generate --chat --prompt "Why is the sky blue?"
# With no arguments: a chat answer from the default model (SmolLM2-135M-Instruct).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
if (($# == 0)); then
  set -- generate --chat --prompt "Explain in two sentences why the sky is blue."
fi
cargo run --locked --release --quiet -- "$@"
