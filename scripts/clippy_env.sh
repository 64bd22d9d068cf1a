# Sourced by check.sh and test.sh: clippy lints our code in the build itself, warnings as errors.
# clippy-driver is rustc with clippy's lints; as the workspace's compiler wrapper it does what
# `cargo clippy` does for our crate, on every target the build compiles (lib, binary, tests),
# while the dependencies are compiled once. `cargo clippy` and then a test build would compile
# every dependency twice (checked, then built: a third of a clean run's build). Every cargo
# command after this runs with the same wrapper, so none rebuilds what another built.
if ! RUSTC_WORKSPACE_WRAPPER="$(command -v clippy-driver)"; then
  echo "clippy-driver not found: rustup component add clippy" >&2
  exit 1
fi
export RUSTC_WORKSPACE_WRAPPER
# How cargo-clippy passes its arguments on to clippy-driver.
export CLIPPY_ARGS="-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
