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

# Entry deltas: 1 % of the keys change between two checkpoints, at the default max
# parallelism (128 key groups, so every key group changes). A job counts 1 M users once
# each and stops with a savepoint; the job restored from it generates 10 000 events/s over
# the same users (event i is user i mod U, so that is 10 000 distinct users, 1 %, per 1 s
# checkpoint) and is cancelled after 14 s. Its first checkpoint is full (a restored job has
# no base), then incremental ones follow, every 10th full.
echo "== 1 % of 1 M keys changed per checkpoint, max parallelism 128, p=2"
"$WEIR" run -p 2 -D rest.port=18997 counter --users 1000000 --rate 1000000 --output none > "$work/fill.log" 2>&1 &
fill=$!
for _ in $(seq 100); do curl -sf localhost:18997/jobs/overview >/dev/null && break; sleep 0.1; done
sleep 3
job=$(curl -s localhost:18997/jobs/overview | python3 -c "import json,sys; print(json.load(sys.stdin)['jobs'][0]['jid'])")
"$WEIR" stop -m 127.0.0.1:18997 --savepoint-path "$work/sp" "$job" > /dev/null
wait "$fill" || true
sp=$(ls -d "$work"/sp/savepoint-*)
"$WEIR" run -p 2 -D rest.port=18997 -s "$sp" -D execution.checkpointing.interval=1s \
  -D execution.checkpointing.incremental=true -D "state.checkpoints.dir=file://$work/deltas" \
  counter --users 1000000 --rate 10000 --output none > "$work/deltas.log" 2>&1 &
delta_job=$!
for _ in $(seq 100); do curl -sf localhost:18997/jobs/overview >/dev/null && break; sleep 0.1; done
sleep 14
job=$(curl -s localhost:18997/jobs/overview | python3 -c "import json,sys; print([j for j in json.load(sys.stdin)['jobs'] if j['state']=='RUNNING'][0]['jid'])")
curl -s "localhost:18997/jobs/$job/checkpoints" | python3 -c '
import json,sys
d=json.load(sys.stdin)
done=[c for c in d["history"] if c["status"]=="COMPLETED"]
k=[c["operator_sizes"].get("counter",0) for c in done]
print("  keyed counter state written per checkpoint, KB (newest first):", [x//1024 for x in k])
full=max(k)
print("  incremental ones as a share of the full one: %s" % ", ".join("%.1f %%" % (100.0*x/full) for x in k if x < full))
'
"$WEIR" cancel -m 127.0.0.1:18997 "$job" > /dev/null
wait "$delta_job" || true
