#!/usr/bin/env bash
# The fast gate to run before each commit (a few minutes on a warm build): formatting, clippy
# with warnings as errors (in the build of every target), the library's unit tests and the
# layering rules (no model, no server), and the web UI's type check. The full suite is
# scripts/test.sh (what CI runs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# Cargo resolves the patched mlx-sys before any build script runs: without it, say what to do
# instead of leaving the newcomer with cargo's "failed to load source" error.
if [[ ! -f .cache/mlx-sys/.patched ]] || { [[ "$(uname -s)" != Darwin ]] && [[ ! -f .cache/mlx-cpu/.ok ]]; }; then
  echo "check.sh: FastMLX builds against MLX prepared by scripts/setup.sh (a patched mlx-sys in" >&2
  echo "check.sh: .cache/mlx-sys and, off macOS, MLX's prebuilt CPU library in .cache/mlx-cpu)." >&2
  echo "check.sh: run 'bash scripts/setup.sh' once (add --test for the full test suite), then this again." >&2
  exit 1
fi
if [[ ! -d ui/node_modules ]]; then
  echo "check.sh: the web UI's packages are missing: run 'bash scripts/setup.sh' once." >&2
  exit 1
fi

step() { echo "check.sh: $*" >&2; }
step "cargo fmt --check"
cargo fmt --check
step "the build of every target, with clippy's lints as errors"
# In the build itself, as scripts/test.sh does: what one builds, the other reuses.
source "$ROOT/scripts/clippy_env.sh"
cargo test --locked --features desktop-tests --no-run -q
step "unit tests and the layering rules"
cargo test --locked --features desktop-tests --lib --test architecture -q
step "the web UI's type check"
npm --prefix ui run --silent check
step "passed"
