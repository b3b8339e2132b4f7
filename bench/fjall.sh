#!/usr/bin/env bash
# The fjall state backend (issue 12): the counter with 10 M keys at p=2 (two passes over the
# keys, 20 M events) on hashmap and fjall, with the state inside and three times outside
# fjall's cache budget, with and without incremental checkpoints every 3 s; then 200 M keys
# with a 512 MB budget and incremental checkpoints every 10 s (peak RSS). Release build.
#
#   bench/fjall.sh            # 10 M keys only
#   BIG=1 bench/fjall.sh      # also 200 M keys (about 35 minutes, 7+ GB under $TMPDIR)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p weir-cli >/dev/null 2>&1
W=$PWD/target/release/weir
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
CHK=(-D execution.checkpointing.interval=3s -D execution.checkpointing.incremental=true -D "state.checkpoints.dir=file://$WORK/chk")

run() {
  local label=$1
  shift
  /usr/bin/time -f "$label: %e s wall, %M KB peak RSS" "$W" run -p 2 -D "io.tmp.dirs=$WORK" "$@" 2>&1 | grep -E "^$label:"
  rm -rf "$WORK/chk"
}

echo "== counter, 10 M keys, 20 M events, p=2"
JOB=(counter --users 10000000 --events 20000000 --output none)
run "hashmap" "${JOB[@]}"
run "hashmap, checkpoints 3s" "${CHK[@]}" "${JOB[@]}"
run "fjall 256mb" -D state.backend.type=fjall "${JOB[@]}"
run "fjall 256mb, incremental checkpoints 3s" -D state.backend.type=fjall "${CHK[@]}" "${JOB[@]}"
run "fjall 64mb" -D state.backend.type=fjall -D state.backend.fjall.memory=64mb "${JOB[@]}"
run "fjall 64mb, incremental checkpoints 3s" -D state.backend.type=fjall -D state.backend.fjall.memory=64mb "${CHK[@]}" "${JOB[@]}"

if [ "${BIG:-0}" = 1 ]; then
  echo "== counter, 200 M keys, 200 M events, p=2, fjall 512mb, incremental checkpoints 10s"
  # In the background, with its checkpoints read from the REST API every 20 s (history
  # keeps the newest 10).
  /usr/bin/time -f "fjall 200M keys: %e s wall, %M KB peak RSS" -o "$WORK/time" "$W" run -p 2 -D "io.tmp.dirs=$WORK" \
    -D rest.port=18931 -D state.backend.type=fjall -D state.backend.fjall.memory=512mb \
    -D execution.checkpointing.interval=10s -D execution.checkpointing.incremental=true \
    -D "state.checkpoints.dir=file://$WORK/chk" counter --users 200000000 --events 200000000 --output none \
    >"$WORK/out" 2>&1 &
  RUN=$!
  while kill -0 $RUN 2>/dev/null; do
    sleep 20
    curl -sf http://127.0.0.1:18931/jobs/overview >"$WORK/jobs" 2>/dev/null || continue
    JOB_ID=$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"]; print(j[0]["jid"] if j else "")' "$WORK/jobs")
    [ -n "$JOB_ID" ] && curl -sf "http://127.0.0.1:18931/jobs/$JOB_ID/checkpoints" >>"$WORK/checkpoints.jsonl" 2>/dev/null && echo >>"$WORK/checkpoints.jsonl"
  done
  wait $RUN || true
  cat "$WORK/time"
  python3 - "$WORK/checkpoints.jsonl" <<'PY'
import json, sys
seen = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    for c in json.loads(line).get("history", []):
        if c["status"] == "COMPLETED":
            seen[c["id"]] = c
for id, c in sorted(seen.items()):
    print(f"checkpoint {id}: {c['end_to_end_duration'] / 1000:.1f} s, wrote {c['checkpointed_size'] / 1e6:.1f} MB of {c['state_size'] / 1e6:.1f} MB")
PY
fi
