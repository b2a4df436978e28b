#!/usr/bin/env bash
# Card server benchmark: installs wrk and nginx if missing, builds release binaries, and
# runs `mop-bench server` (304 answers/s side by side with nginx, manifest and delta sizes).
# Extra arguments go to mop-bench, e.g. bench/server.sh --cards 10000 --rounds 5.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v nginx >/dev/null || missing+=(nginx)
if ((${#missing[@]})); then
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
fi
cargo build --release --locked -p mop-server -p mop-bench
exec "${CARGO_TARGET_DIR:-target}/release/mop-bench" server "$@"
