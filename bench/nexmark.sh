#!/usr/bin/env bash
# Nexmark throughput, whole process (start-up, job graph, run to FINISHED, shutdown), for
# each query at p=1 and p=2, output discarded. Prints the median of RUNS runs per line.
#
#   bench/nexmark.sh                  # 10,000,000 events per run, RUNS=3
#   EVENTS=2000000 RUNS=1 bench/nexmark.sh q5 q7
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-3}"
EVENTS="${EVENTS:-10000000}"
QUERIES=("$@")
[ ${#QUERIES[@]} -gt 0 ] || QUERIES=(q0 q1 q2 q3 q4 q5 q7 q8 q11)
cargo build --release -p weir-cli >/dev/null 2>&1
WEIR="${WEIR:-target/release/weir}"

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

wall_seconds() {
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$end - $start" | bc -l
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $EVENTS events per run"
for query in "${QUERIES[@]}"; do
  for p in 1 2; do
    seconds=$(for _ in $(seq "$RUNS"); do wall_seconds "$WEIR" run -D rest.port=0 -p "$p" nexmark --query "$query" --events "$EVENTS" --output none; done | median)
    printf '%-4s p=%s  median %6.2f s  %5.2f M events/s\n' "$query" "$p" "$seconds" "$(echo "$EVENTS / $seconds / 1000000" | bc -l)"
  done
done
