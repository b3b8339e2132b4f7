#!/usr/bin/env bash
# CPU time of a job's master thread while its checkpoints take longer than their interval
# (3 M keys, a checkpoint every 20 ms): it should sleep between events, not spin.
#
#   bench/jobmaster-cpu.sh [WEIR_BINARY]     # default target/release/weir
set -euo pipefail
WEIR="${1:-target/release/weir}"
DATA=$(mktemp -d)
export WEIR_DATA_DIR="$DATA"
"$WEIR" run -D rest.port=0 -D execution.checkpointing.interval=20ms counter --users 3000000 --events 2000000000 \
  --output none >/dev/null 2>&1 &
JOB=$!
cleanup() {
  kill "$JOB" 2>/dev/null || true
  wait "$JOB" 2>/dev/null || true
  rm -rf "$DATA"
}
trap cleanup EXIT
sleep 4
THREAD=$(dirname "$(grep -l "weir-jobmaster" /proc/"$JOB"/task/*/comm | head -1)")
ticks() { awk '{print $14 + $15}' "$THREAD/stat"; }
start=$(ticks)
sleep 12
end=$(ticks)
echo "job master thread: $(awk -v t=$((end - start)) -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz }') s of CPU in 12 s"
