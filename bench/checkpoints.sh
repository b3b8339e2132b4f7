#!/usr/bin/env bash
# Checkpoint and savepoint costs of the counter job, whole binary, local disk.
#
#   bench/checkpoints.sh            # 1 M keys; KEYS=10000000 bench/checkpoints.sh for 10 M
#
# Prints: checkpoint duration and size (from REST), stop-with-savepoint wall time and size,
# restore-with-rescale time (launch until every subtask RUNNING with its state loaded),
# and counter throughput with 1 s checkpoints versus none.
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS="${KEYS:-1000000}"
cargo build --release -p weir-cli >/dev/null 2>&1
WEIR="$PWD/target/release/weir"
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$WORK"' EXIT
PORT=18181

now_ms() { date +%s%3N; }

wait_running() { # $1 = port; prints the job id once every subtask is RUNNING
  local body
  for _ in $(seq 5000); do
    body=$(curl -s "localhost:$1/jobs/overview" || true)
    if echo "$body" | grep -q '"state":"RUNNING"' && ! echo "$body" | grep -qE '"(created|scheduled|deploying|initializing)":[1-9]'; then
      echo "$body" | grep -o '"jid":"[0-9a-f]*"' | head -1 | cut -d'"' -f4
      return
    fi
    sleep 0.005
  done
  echo "job did not start" >&2; exit 1
}

# Epoch ms when the last subtask of job $2 entered RUNNING (its state loaded), from REST.
last_subtask_running_ms() {
  curl -s "localhost:$1/jobs/$2" | python3 -c '
import json,sys
job=json.load(sys.stdin)
print(max(s["timestamps"]["RUNNING"] for v in job["vertices"] for s in v["subtasks"]))'
}

echo "== counter state of $KEYS keys, p=2, checkpoints every 2 s"
"$WEIR" run -D rest.port=$PORT -D execution.checkpointing.interval=2s -D "state.checkpoints.dir=file://$WORK/chk" \
  -p 2 counter --users "$KEYS" --output none >/dev/null 2>&1 &
JID=$(wait_running $PORT)
# Let every key get state, then let a few checkpoints complete.
sleep $(( KEYS / 5000000 + 5 ))
curl -s "localhost:$PORT/jobs/$JID/checkpoints" | python3 -c '
import json,sys
c=json.load(sys.stdin)
done=[h for h in c["history"] if h["status"]=="COMPLETED"]
for h in done[:3]:
    print("checkpoint %d: %d ms, %.1f MB (counter %.1f MB)" % (h["id"], h["end_to_end_duration"], h["state_size"]/1e6, h["operator_sizes"].get("counter",0)/1e6))'
start=$(now_ms)
OUT=$("$WEIR" stop -m "127.0.0.1:$PORT" --savepoint-path "$WORK/sp" "$JID")
end=$(now_ms)
wait
SP=$(echo "$OUT" | sed -n 's/^Savepoint completed. Path: file:\/\///p')
echo "stop with savepoint: $((end - start)) ms (CLI round trip), $(du -sm "$SP" | cut -f1) MB on disk"

echo "== restore with rescale p=2 -> 4"
start=$(now_ms)
"$WEIR" run -D rest.port=$PORT -s "$SP" -p 4 counter --users "$KEYS" --output none >/dev/null 2>&1 &
JID=$(wait_running $PORT)
end=$(last_subtask_running_ms $PORT "$JID")
echo "restore at p=4: $((end - start)) ms from launch to every subtask RUNNING (state read and checked)"
# Restored keyed state is decoded into typed tables when the function first touches it:
# also report when every subtask of every task has emitted records (no zero counter left).
for _ in $(seq 4000); do
  curl -s "localhost:$PORT/jobs/$JID" | grep -q '"write-records":0[,}]' || break
  sleep 0.002
done
echo "restore at p=4: $(( $(now_ms) - start )) ms from launch until every subtask has decoded its state and emitted records"
"$WEIR" cancel -m "127.0.0.1:$PORT" "$JID" >/dev/null
wait

echo "== throughput: counter --users 100000 --events 20000000 --output none, p=1"
for interval in none 1s; do
  start=$(now_ms)
  if [ "$interval" = none ]; then
    "$WEIR" run -D rest.port=0 -p 1 counter --users 100000 --events 20000000 --output none >/dev/null 2>&1
  else
    "$WEIR" run -D rest.port=0 -D execution.checkpointing.interval=$interval -D "state.checkpoints.dir=file://$WORK/tp" \
      -p 1 counter --users 100000 --events 20000000 --output none >/dev/null 2>&1
  fi
  end=$(now_ms)
  echo "checkpoints $interval: $((end - start)) ms, $(python3 -c "print(round(20000/($end-$start),1))") M events/s"
done
