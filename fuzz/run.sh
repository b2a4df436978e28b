#!/usr/bin/env bash
# Fuzzes mop's parsers of untrusted input with cargo-fuzz on stable Rust (`-s none`:
# libFuzzer's coverage guidance without a sanitizer; Rust's own checks catch the rest).
#
#   bash fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Defaults: 60 s for each of card_parser, memory_md, daemon_requests, object_batch, mcp_jsonrpc, intake. The corpus grows in
# $CARGO_TARGET_DIR/fuzz-corpus/<target> (seeded from fuzz/seeds/<target>). A crash stops
# the run with libFuzzer's report; copy the input it names into fuzz/regressions/<target>/
# so `tests/fuzz_regressions.rs` replays it in every CI run from then on.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(card_parser memory_md daemon_requests object_batch mcp_jsonrpc intake)

command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --version 0.13.2
target_dir=${CARGO_TARGET_DIR:-target}
cargo fuzz build -s none --features libfuzzer -O 2>&1 | tail -n 1

for t in "${targets[@]}"; do
    corpus="$target_dir/fuzz-corpus/$t"
    rm -rf "$target_dir/fuzz-artifacts/$t"
    mkdir -p "$corpus" "$target_dir/fuzz-artifacts/$t"
    echo "fuzz: $t for ${secs}s (seeds: fuzz/seeds/$t, corpus: $corpus)"
    # -rss_limit_mb keeps a runaway allocation a finding instead of an OOM kill;
    # -max_len covers a 64 KiB card body plus its frontmatter.
    cargo fuzz run -s none --features libfuzzer -O "$t" "$corpus" "fuzz/seeds/$t" \
        -- -max_total_time="$secs" -max_len=90000 -rss_limit_mb=2048 -timeout=10 \
        -artifact_prefix="$target_dir/fuzz-artifacts/$t/" -print_final_stats=1 2>&1 |
        grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb|==|SUMMARY|thread|Running)|panicked|Test unit written' || true
    if [ -n "$(ls -A "$target_dir/fuzz-artifacts/$t")" ]; then
        echo "fuzz: $t found a failing input: $(ls "$target_dir/fuzz-artifacts/$t")" >&2
        exit 1
    fi
done
