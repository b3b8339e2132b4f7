#!/usr/bin/env bash
# Throughput benchmarks of the built-in jobs, whole process included (start-up, REST server,
# job graph, run, shutdown). Prints one line per configuration with the median of RUNS runs.
#
#   bench/run.sh            # counter p=1,2 (20M events, 100k users) and wordcount 100 MB p=1,2
#   RUNS=3 bench/run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-5}"
cargo build --release -p weir-cli >/dev/null 2>&1
WEIR=target/release/weir
TEXT=/tmp/weir-bench-100mb.txt
[ -f "$TEXT" ] || python3 bench/make-text.py 100 "$TEXT" >/dev/null

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

wall_seconds() {
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$end - $start" | bc -l
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for p in 1 2; do
  times=$(for _ in $(seq "$RUNS"); do wall_seconds $WEIR run -D rest.port=0 -p "$p" counter --users 100000 --events 20000000 --output none; done | median)
  printf 'counter  p=%s  20,000,000 events  median %.3f s  %.1f M events/s\n' "$p" "$times" "$(echo "20 / $times" | bc -l)"
done
size_mb=$(du -m "$TEXT" | cut -f1)
for p in 1 2; do
  times=$(for _ in $(seq "$RUNS"); do rm -rf /tmp/weir-bench-wc-out; wall_seconds $WEIR run -D rest.port=0 -p "$p" wordcount --input "$TEXT" --output /tmp/weir-bench-wc-out; done | median)
  printf 'wordcount p=%s  %s MB  median %.3f s  %.1f MB/s\n' "$p" "$size_mb" "$times" "$(echo "$size_mb / $times" | bc -l)"
done
rm -rf /tmp/weir-bench-wc-out
