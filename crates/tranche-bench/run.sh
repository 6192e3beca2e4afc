#!/usr/bin/env bash
# tranche-bench/run.sh: the benchmark at 10,000 and 1,000,000 requests, each in its own process,
# then both peak RSS figures and their ratio. Extra arguments go to tranche-bench (e.g.
# `--sim child` to keep the simulator out of the measured process, `--json`).
#
# A run at 1,000,000 requests of about 1 KB writes about 1 GB of input and, with the database,
# raw results and WAL, needs about 6 GB free under BENCH_DIR (default: target/bench-tmp), which is
# removed afterwards; the simulator's spool folder (about 2 GB at that size) goes under TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/../.."

dir="${BENCH_DIR:-$PWD/target/bench-tmp}"
need_kb=$((6 * 1024 * 1024))
mkdir -p "$dir"
trap 'rm -rf "$dir"' EXIT
free_kb=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
if [ "$free_kb" -lt "$need_kb" ]; then
    echo "run.sh: only $((free_kb / 1024)) MB free under $dir; the 1,000,000 run needs about 6 GB" >&2
    exit 1
fi

cargo build --release -p tranche-bench
target/release/tranche-bench --compare --compare-sizes 10000,1000000 --dir "$dir" "$@"
