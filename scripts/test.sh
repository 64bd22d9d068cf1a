#!/usr/bin/env bash
# The test suite: set-up (idempotent), then the gate (cargo fmt --check, clippy -D warnings, the
# web UI's type check), the Rust tests (extra arguments go to `cargo test`), the API tests through the official Python and Node client
# libraries, the coding agents' binaries, the web UI in Chromium and the desktop app in its window.
# Nothing here can hang: each suite has a time limit (per test in pytest, per file in node, and the
# whole suite under `timeout`), and the run fails if a `fastmlx` it started is still running at the end.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh" --test
cd "$ROOT"

# Every process this run starts inherits this marker: the check at the end tells ours by it
# (and leaves alone a `fastmlx` someone else runs on the same machine).
export FASTMLX_TEST_RUN="$$.$(date +%s%N)"

# The pids of the `fastmlx` processes started by this run that are still alive (Linux: /proc).
leftovers() {
  local dir
  for dir in /proc/[0-9]*; do
    [[ "$(cat "$dir/comm" 2>/dev/null)" == fastmlx ]] || continue
    # A zombie's environment reads empty: it is dead already.
    if tr '\0' '\n' 2>/dev/null < "$dir/environ" | grep -qxF "FASTMLX_TEST_RUN=$FASTMLX_TEST_RUN"; then
      echo "${dir#/proc/}"
    fi
  done
  return 0
}

# On every exit, passed or failed: a `fastmlx` left running fails the run (and is ended here).
check_leftovers() {
  local rc=$? pids
  pids="$(leftovers)"
  if [[ -n "$pids" ]]; then
    echo "test.sh: FAILED: fastmlx processes started by this run are still running:" >&2
    ps -o pid,ppid,etime,args -p "${pids//$'\n'/,}" >&2 || true
    kill -TERM $pids 2>/dev/null || true
    sleep 5
    pids="$(leftovers)"
    [[ -z "$pids" ]] || kill -KILL $pids 2>/dev/null || true
    rc=1
  fi
  exit "$rc"
}
trap check_leftovers EXIT

# suite SECONDS NAME COMMAND...: a last resort behind the runners' own limits. Past SECONDS,
# `timeout` stops the suite's whole process group (SIGTERM, SIGKILL 30 s later) and the run fails
# with a message. In the background with `wait`: `timeout` puts the suite in a process group of its
# own, out of reach of Ctrl-C, so the traps below pass it on.
SUITE=""
suite() {
  local limit="$1" name="$2" rc=0
  shift 2
  timeout --kill-after=30 "$limit" "$@" &
  SUITE=$!
  wait "$SUITE" || rc=$?
  SUITE=""
  if ((rc == 124 || rc == 137)); then
    echo "test.sh: FAILED: $name did not finish within its limit of ${limit}s and was stopped" >&2
  fi
  return "$rc"
}
stop_suite() {
  if [[ -n "$SUITE" ]]; then
    kill "-$1" "$SUITE" 2>/dev/null || true
    for _ in {1..100}; do kill -0 "$SUITE" 2>/dev/null || break; sleep 0.1; done
    # What ignored the signal (or outlived the suite) ends with its process group.
    kill -KILL -- "-$SUITE" 2>/dev/null || true
  fi
  exit "$2"
}
trap 'stop_suite INT 130' INT
trap 'stop_suite TERM 143' TERM

# The gate: formatting (rustfmt.toml) and lints, warnings as errors, on every target.
suite 300 "the format check" cargo fmt --check
# The web UI's TypeScript, type-checked (Vite's build does not).
suite 300 "the web UI's type check" npm --prefix "$ROOT/ui" run --silent check
# Clippy, warnings as errors, in the test build itself (scripts/clippy_env.sh).
source "$ROOT/scripts/clippy_env.sh"
# `desktop-tests`: the desktop commands also run on Tauri's mock runtime. The build first, so that
# the tests' limit is theirs alone.
suite 3600 "the test build (with clippy)" cargo test --locked --features desktop-tests --no-run "$@"
suite 1800 "the Rust tests" cargo test --locked --features desktop-tests "$@"
# Tests that need root, run here as root (as CI is) and said to be skipped otherwise (libtest
# lists them as ignored, with the reason, in the run above): the disk-full tests mount a tmpfs;
# the cluster's network tests (Linux) put its machines in network namespaces of their own.
if [[ "$(id -u)" == 0 ]]; then
  suite 600 "the disk-full tests" cargo test --locked --features desktop-tests --test download -- --ignored
  if [[ "$(uname -s)" == "Linux" ]]; then
    suite 600 "the cluster's network tests" \
      cargo test --locked --features desktop-tests --test cluster_serve -- --ignored on_a_network::
  fi
else
  echo "test.sh: SKIPPED: the disk-full tests of tests/download.rs (they mount a tmpfs: run as root)" >&2
  if [[ "$(uname -s)" == "Linux" ]]; then
    echo "test.sh: SKIPPED: the network tests of tests/cluster_serve.rs (network namespaces: run as root)" >&2
  fi
fi
# The API through the official client libraries, against a running `fastmlx serve`.
export FASTMLX_BIN="$ROOT/target/debug/fastmlx"
# pytest-timeout: 300 s for each test, its fixtures included (the first starts the server).
suite 1200 "the Python client tests" "$ROOT/.cache/venv/bin/python" -m pytest -q -p no:cacheprovider --timeout=300 "$ROOT/tests/clients"
# --test-timeout: node's runner ends each test file that runs longer (node 20 times the whole file).
suite 600 "the Node client tests" node --test --test-timeout=300000 "$ROOT/tests/clients/"
# The coding agents' own binaries against `fastmlx serve`, with no network but loopback.
suite 1500 "the coding agent tests" "$ROOT/scripts/loopback_only.sh" "$ROOT/.cache/venv/bin/python" -m pytest -q -p no:cacheprovider --timeout=300 "$ROOT/tests/agents"
# The web UI in headless Chromium, against a running `fastmlx serve`.
suite 1500 "the web UI tests" node --test --test-timeout=600000 "$ROOT/tests/ui/"
# The desktop app in its real window (Xvfb, WebKitWebDriver); needs the default `desktop` feature.
suite 900 "the desktop app test" xvfb-run -a -s "-screen 0 1280x800x24" node --test --test-timeout=600000 "$ROOT/tests/desktop/"
