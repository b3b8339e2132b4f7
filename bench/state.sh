#!/usr/bin/env bash
# Large state on the heap backend (issue 12): what checkpoints cost the counter with 10 M keys
# (time and peak memory, with and without checkpoints every 3 s), how fast canonical and
# native savepoints of 10 M keys are written while the job runs, the disk's own write speed,
# and stop-with-savepoint of 1 M keys. Release build; takes about 3 minutes.
#
#   bench/state.sh            # ROUNDS=3 by default
#   WEIR=/path/to/weir bench/state.sh   # another build (to compare two in one run)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${WEIR:-}" ]; then
  cargo build --release -p weir-cli >/dev/null 2>&1
fi
W=${WEIR:-$PWD/target/release/weir}
ROUNDS=${ROUNDS:-3}
WORK=$(mktemp -d)
trap 'pkill -f "rest.port=18998" || true; rm -rf "$WORK"' EXIT

echo "== counter, 10 M keys, 40 M events, p=2 (wall s, peak RSS KB), $ROUNDS rounds"
for round in $(seq "$ROUNDS"); do
  for cp in off 3s; do
    args=()
    [ "$cp" = 3s ] && args=(-D execution.checkpointing.interval=3s -D "state.checkpoints.dir=file://$WORK/chk")
    /usr/bin/time -f "checkpoints $cp: %e s, %M KB" "$W" run -p 2 "${args[@]}" counter --users 10000000 --events 40000000 --output none 2>&1 | grep "checkpoints $cp"
    rm -rf "$WORK/chk"
  done
done

echo "== the disk: dd 512 MiB with fdatasync"
dd if=/dev/zero of="$WORK/dd" bs=1M count=512 conv=fdatasync 2>&1 | tail -1
rm -f "$WORK/dd"

echo "== savepoints of 10 M keys while the job runs (state size / end-to-end duration)"
"$W" run -p 2 -D rest.port=18998 counter --users 10000000 --rate 4000000 --output none >"$WORK/run.log" 2>&1 &
sleep 6
JOB=$(curl -s localhost:18998/jobs/overview | python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['jid'])")
for round in $(seq "$ROUNDS"); do
  for type in canonical native; do
    "$W" savepoint -m 127.0.0.1:18998 --type "$type" "$JOB" "$WORK/sp" >/dev/null
    curl -s "localhost:18998/jobs/$JOB/checkpoints" | python3 -c "
import json,sys
h=json.load(sys.stdin)['history'][0]
print(f\"$type: {h['state_size']/1e6:.1f} MB in {h['end_to_end_duration']} ms = {h['state_size']/1e3/max(1,h['end_to_end_duration']):.0f} MB/s\")"
  done
done
"$W" cancel -m 127.0.0.1:18998 "$JOB" >/dev/null
sleep 1

echo "== stop-with-savepoint of 1 M keys (wall time of weir stop)"
for round in $(seq "$ROUNDS"); do
  "$W" run -p 2 -D rest.port=18998 counter --users 1000000 --rate 3000000 --output none >"$WORK/run.log" 2>&1 &
  sleep 2
  JOB=$(curl -s localhost:18998/jobs/overview | python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['jid'])")
  /usr/bin/time -f "stop: %e s" "$W" stop -m 127.0.0.1:18998 --savepoint-path "$WORK/sp" "$JOB" 2>&1 | grep "stop:"
  wait
done
