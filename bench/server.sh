#!/usr/bin/env bash
# The card server benchmark alone (304 answers/s side by side with nginx, manifest and
# delta sizes). bench/all.sh runs it with the others. Extra arguments go to
# `mop-bench server`, e.g. bench/server.sh --cards 10000 --rounds 5.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v wrk >/dev/null && command -v nginx >/dev/null || {
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q wrk nginx
}
cargo build --release --locked -p mop-server -p mop-bench
exec "${CARGO_TARGET_DIR:-target}/release/mop-bench" server "$@"
