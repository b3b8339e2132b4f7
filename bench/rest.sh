#!/usr/bin/env bash
# What watching a job costs: REST latencies while a job runs, and the counter's throughput
# with and without a client polling the Web UI's endpoints 10 times a second (30x the UI's
# refresh rate).
#
#   bench/rest.sh           # RUNS=5 by default
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-5}"
cargo build --release -p weir-cli >/dev/null 2>&1
WEIR=target/release/weir
PORT="${PORT:-18481}"
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"

# 1. Latency of each endpoint (median of 100 requests) during a paced job at p=4 with 1 s
#    checkpoints of 100k keys.
CP=$(mktemp -d)
$WEIR run -p 4 -D rest.port=$PORT -D execution.checkpointing.interval=1s -D state.checkpoints.dir=file://$CP \
  counter --enrich --users 100000 --rate 200000 --output none >/dev/null 2>&1 &
RUN=$!
trap 'kill $RUN 2>/dev/null || true; rm -rf "$CP"' EXIT
until curl -sf localhost:$PORT/jobs/overview | grep -q RUNNING; do sleep 0.1; done
sleep 3
JOB=$(curl -s localhost:$PORT/jobs | sed -E 's/.*"id":"([0-9a-f]{32})".*/\1/')
VERTEX=$(curl -s localhost:$PORT/jobs/$JOB/plan | sed -E 's/.*"nodes":\[\{"id":"([0-9a-f]{32})".*/\1/')
for path in / /app.js /overview /jobs/overview /jobs/$JOB /jobs/$JOB/checkpoints /jobs/$JOB/exceptions \
            /jobs/$JOB/vertices/$VERTEX/backpressure /taskmanagers/embedded /metrics /openapi.json; do
  if [[ $path == */backpressure ]]; then
    # Measured over the time since the previous request when that is 0.2-60 s ago (a UI
    # polling), else over a 0.5 s window the request waits for: poll as the UI would.
    ms=$(for _ in $(seq 10); do sleep 0.3; curl -s -o /dev/null -w '%{time_total}\n' "localhost:$PORT$path"; done | median)
  else
    ms=$(for _ in $(seq 100); do curl -s -o /dev/null -w '%{time_total}\n' "localhost:$PORT$path"; done | median)
  fi
  shown=${path/$JOB/<job>}; shown=${shown/$VERTEX/<vertex>}
  printf '%-52s median %.2f ms\n' "GET $shown" "$(echo "$ms * 1000" | bc -l)"
done
kill $RUN; wait $RUN 2>/dev/null || true

# 2. Throughput with and without a polling client.
run_counter() {
  local start end
  start=$(date +%s.%N)
  $WEIR run -p 2 -D rest.port=$PORT counter --users 100000 --events 20000000 --output none >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$end - $start" | bc -l
}
poll() {
  while true; do
    for job in $(curl -s localhost:$PORT/jobs 2>/dev/null | grep -oE '[0-9a-f]{32}'); do
      curl -s -o /dev/null localhost:$PORT/jobs/$job
      curl -s -o /dev/null localhost:$PORT/jobs/$job/checkpoints
      curl -s -o /dev/null localhost:$PORT/metrics
    done
    sleep 0.1
  done
}
quiet=$(for _ in $(seq "$RUNS"); do run_counter; done | median)
poll & POLL=$!
watched=$(for _ in $(seq "$RUNS"); do run_counter; done | median)
kill $POLL
printf 'counter p=2 20M events, nobody watching:       median %.3f s  %.1f M events/s\n' "$quiet" "$(echo "20 / $quiet" | bc -l)"
printf 'counter p=2 20M events, polled 10x per second: median %.3f s  %.1f M events/s\n' "$watched" "$(echo "20 / $watched" | bc -l)"
