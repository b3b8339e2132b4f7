#!/usr/bin/env bash
# Bytes written per checkpoint, full versus incremental, on a counter whose updates between
# two checkpoints touch a small part of the key groups: 50 000 users, 5 000 events/s, a
# checkpoint every second, max parallelism 32768 (about 1.5 users per key group), p=2.
# Sizes do not depend on the build; WEIR=target/debug/weir works as well as the release one.
set -euo pipefail
WEIR=${WEIR:-target/release/weir}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {
  local name=$1; shift
  "$WEIR" run -D rest.port=0 -D execution.checkpointing.interval=1s -D pipeline.max-parallelism=32768 \
    -D "state.checkpoints.dir=file://$work/$name" -D state.checkpoints.num-retained=2 "$@" -p 2 \
    counter --users 50000 --events 100000 --rate 5000 --output none > "$work/$name.log" 2>&1 &
  local pid=$!
  local rest=""
  for _ in $(seq 100); do
    rest=$(grep -o 'http://[0-9.:]*' "$work/$name.log" | head -1 || true)
    [ -n "$rest" ] && break; sleep 0.1
  done
  local job; job=$(grep -o 'JobID [0-9a-f]*' "$work/$name.log" | awk '{print $2}' | head -1)
  local last=""
  while kill -0 "$pid" 2>/dev/null; do
    last=$(curl -s "$rest/jobs/$job/checkpoints" || echo "$last"); sleep 0.5
  done
  echo "$last" | python3 -c '
import json,sys
d=json.load(sys.stdin)
done=[c for c in d["history"] if c["status"]=="COMPLETED"]
w=[c["checkpointed_size"] for c in done]; s=[c["state_size"] for c in done]
k=[c["operator_sizes"].get("counter",0) for c in done]
print("'"$name"'", "checkpoints", d["counts"]["completed"])
print("  keyed counter state written per checkpoint, KB (newest 10, newest first):", [x//1024 for x in k])
print("  all bytes written (the source positions included), KB:", [x//1024 for x in w])
print("  whole state, KB:", [x//1024 for x in s])
'
}
run full
run incremental -D execution.checkpointing.incremental=true
echo "shared/ files left after the incremental job:"; ls "$work"/incremental/*/shared | wc -l
