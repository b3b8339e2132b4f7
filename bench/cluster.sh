#!/usr/bin/env bash
# Standalone cluster costs: cluster start, submit to RUNNING, TaskManager death to RUNNING
# (restart delay 0, so only detection + redeploy + restore are measured), and throughput at
# p=2 across two TaskManagers (1 slot each).
#
#   bench/cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p weir-cli >/dev/null 2>&1
WEIR="$PWD/target/release/weir"
WORK=$(mktemp -d)
export WEIR_DATA_DIR="$WORK/data"
trap '"$WEIR" cluster stop >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
now_ms() { date +%s%3N; }
REST=127.0.0.1:18481
CONF=(-D rest.port=18481 -D jobmanager.rpc.port=18482 -D heartbeat.interval=200ms -D heartbeat.timeout=5s)

echo "== cluster start"
"$WEIR" cluster start --taskmanagers 2 "${CONF[@]}"

echo "== submit to RUNNING (counter, p=2, unbounded)"
for round in 1 2 3; do
  start=$(now_ms)
  JID=$("$WEIR" run -m $REST -d -p 2 counter --users 1000 --rate 1000 --output none | sed -n 's/^Job has been submitted with JobID //p')
  until curl -s "$REST/jobs/$JID" | grep -q '"state":"RUNNING"' && ! curl -s "$REST/jobs/$JID" | grep -qE '"(created|scheduled|deploying|initializing)":[1-9]'; do sleep 0.002; done
  echo "submit $round: $(( $(now_ms) - start )) ms from the CLI's start to every subtask RUNNING"
  "$WEIR" cancel -m $REST "$JID" >/dev/null
done

echo "== throughput across two TaskManagers (counter, 100 k users, 20 M events, p=2, output none)"
start=$(now_ms)
"$WEIR" run -m $REST -p 2 counter --users 100000 --events 20000000 --output none >/dev/null
end=$(now_ms)
echo "p=2 over TCP: $((end - start)) ms, $(python3 -c "print(round(20000/($end-$start),1))") M events/s"

echo "== TaskManager death to RUNNING (checkpoints 200 ms, fixed-delay with 0 ms delay)"
# TaskManagers that may be killed: the cluster's two, then the spares started below.
mapfile -t VICTIMS < <(sed -n '2,$p' "$WEIR_DATA_DIR/cluster/cluster.pids")
for round in 1 2 3; do
  "$WEIR" taskmanager --jobmanager 127.0.0.1:18482 "${CONF[@]}" >>"$WORK/tm-spare.log" 2>&1 &
  VICTIMS+=("$!")
  sleep 0.5
  JID=$("$WEIR" run -m $REST -d -D execution.checkpointing.interval=200ms -D "state.checkpoints.dir=file://$WORK/chk" \
    -D restart-strategy.type=fixed-delay -D restart-strategy.fixed-delay.attempts=5 -D restart-strategy.fixed-delay.delay=0ms \
    -p 2 counter --users 1000 --rate 5000 --output none | sed -n 's/^Job has been submitted with JobID //p')
  sleep 1.5
  VICTIM=${VICTIMS[0]}
  VICTIMS=("${VICTIMS[@]:1}")
  start=$(now_ms)
  kill -9 "$VICTIM" 2>/dev/null || true
  sleep 0.02
  until curl -s "$REST/jobs/$JID" | grep -q '"numRestarts":[1-9]' && curl -s "$REST/jobs/$JID" | grep -q '"state":"RUNNING"' \
    && ! curl -s "$REST/jobs/$JID" | grep -qE '"(created|scheduled|deploying|initializing|canceling)":[1-9]'; do
    [ $(( $(now_ms) - start )) -gt 20000 ] && { echo "round $round: the killed TaskManager ran no subtask of the job"; break; }
    sleep 0.002
  done
  echo "death to RUNNING $round: $(( $(now_ms) - start )) ms"
  "$WEIR" cancel -m $REST "$JID" >/dev/null
done
for pid in "${VICTIMS[@]}"; do kill "$pid" 2>/dev/null || true; done
