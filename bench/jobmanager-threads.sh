#!/usr/bin/env bash
# Threads of a session JobManager before and after it ran jobs to their end: a job that ended
# must leave no thread behind (its master thread and snapshot writer threads once did).
#
#   bench/jobmanager-threads.sh [WEIR_BINARY] [JOBS]     # default target/release/weir, 5 jobs
set -euo pipefail
WEIR="${1:-target/release/weir}"
JOBS="${2:-5}"
PORT="${PORT:-18181}"
DATA=$(mktemp -d)
export WEIR_DATA_DIR="$DATA"
cleanup() {
  pkill -f "rest.port=$PORT" 2>/dev/null || true
  rm -rf "$DATA"
}
trap cleanup EXIT
"$WEIR" cluster start --taskmanagers 1 -D rest.port="$PORT" -D jobmanager.rpc.port=$((PORT + 1)) \
  -D taskmanager.numberOfTaskSlots=2 >"$DATA/cluster.log" 2>&1
JM=$(pgrep -f "weir jobmanager .*rest.port=$PORT" | head -1)
before=$(ls /proc/"$JM"/task | wc -l)
for _ in $(seq "$JOBS"); do
  "$WEIR" run -m localhost:"$PORT" -D execution.checkpointing.interval=1s counter --users 10 --events 1000 --output none >/dev/null
done
sleep 2
after=$(ls /proc/"$JM"/task | wc -l)
echo "JobManager threads: $before before, $after after $JOBS finished jobs"
ps -o comm= -L -p "$JM" | sort | uniq -c | sort -rn
