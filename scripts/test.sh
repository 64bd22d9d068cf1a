#!/usr/bin/env bash
# The test suite: set-up (idempotent), then the Rust tests (extra arguments go to `cargo test`)
# and the API tests through the official Python and Node client libraries.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
cargo test --locked "$@"
# The API through the official client libraries, against a running `fastmlx serve`.
export FASTMLX_BIN="$ROOT/target/debug/fastmlx"
"$ROOT/.cache/venv/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/tests/clients"
node --test "$ROOT/tests/clients/"
