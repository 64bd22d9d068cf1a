#!/usr/bin/env bash
# The test suite: set-up (idempotent), then every Rust test. Extra arguments go to `cargo test`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
cargo test --locked "$@"
# The API through the official client libraries, against a running `fastmlx serve`.
FASTMLX_BIN="$ROOT/target/debug/fastmlx" "$ROOT/.cache/venv/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/tests/clients"
