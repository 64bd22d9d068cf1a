#!/usr/bin/env bash
# The test suite: set-up (idempotent), then the Rust tests (extra arguments go to `cargo test`)
# the API tests through the official Python and Node client libraries, the web UI in Chromium and
# the desktop app in its window.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"
# `desktop-tests`: the desktop commands also run on Tauri's mock runtime.
cargo test --locked --features desktop-tests "$@"
# The API through the official client libraries, against a running `fastmlx serve`.
export FASTMLX_BIN="$ROOT/target/debug/fastmlx"
"$ROOT/.cache/venv/bin/python" -m pytest -q -p no:cacheprovider "$ROOT/tests/clients"
node --test "$ROOT/tests/clients/"
# The web UI in headless Chromium, against a running `fastmlx serve`.
node --test "$ROOT/tests/ui/"
# The desktop app in its real window (Xvfb, WebKitWebDriver); needs the default `desktop` feature.
xvfb-run -a -s "-screen 0 1280x800x24" node --test "$ROOT/tests/desktop/"
