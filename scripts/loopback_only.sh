#!/usr/bin/env bash
# Runs a command with no network but loopback (Linux): in a new user and network namespace,
# whose only interface is `lo`. The coding-agent tests run in it, so the agents reach the local
# server and nothing else. Needs unprivileged user namespaces (util-linux `unshare`) and `ip`.
set -euo pipefail
if [[ "$(uname -s)" != Linux ]]; then
  echo "loopback_only.sh: needs Linux (user and network namespaces)" >&2
  exit 2
fi
exec unshare --user --map-root-user --net -- sh -c 'ip link set lo up && exec "$@"' loopback_only "$@"
