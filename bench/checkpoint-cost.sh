#!/usr/bin/env bash
# What checkpoints cost a job with large heap state (issue 30, item 2): the counter with
# 10 M keys, 40 M events, p=2, run without checkpoints, with full checkpoints every 3 s and
# with incremental checkpoints every 3 s, the three alternating round by round (each round
# in another order) so the machine's noise hits them alike. Prints each mode's wall times, median, and peak RSS, and
# the medians' cost over no checkpoints (goal: at most 5 % time, 1.3x memory).
#
#   bench/checkpoint-cost.sh                  # RUNS=5 rounds, about 2 minutes
#   WEIR=/path/to/weir RUNS=9 bench/checkpoint-cost.sh
#   USERS=1000000 EVENTS=20000000 bench/checkpoint-cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${WEIR:-}" ]; then
  cargo build --release -p weir-cli >/dev/null 2>&1
fi
W=${WEIR:-$PWD/target/release/weir}
RUNS=${RUNS:-5}
USERS=${USERS:-10000000}
EVENTS=${EVENTS:-40000000}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

echo "== counter, $USERS keys, $EVENTS events, p=2, checkpoints every 3 s; $RUNS alternating rounds"
modes=(none full incremental)
for round in $(seq "$RUNS"); do
  # Each round starts with another mode, so no mode always follows the same one, and the
  # previous run's checkpoint files are synced first: their write-back would land on the next.
  for step in 0 1 2; do
    mode=${modes[$(((round + step) % 3))]}
    sync
    args=()
    case $mode in
      full) args=(-D execution.checkpointing.interval=3s -D "state.checkpoints.dir=file://$WORK/chk") ;;
      incremental) args=(-D execution.checkpointing.interval=3s -D execution.checkpointing.incremental=true
        -D "state.checkpoints.dir=file://$WORK/chk") ;;
    esac
    /usr/bin/time -f "$mode %e %M" -o "$WORK/time" "$W" run -p 2 "${args[@]}" counter --users "$USERS" \
      --events "$EVENTS" --output none >/dev/null 2>&1
    cat "$WORK/time" >>"$WORK/results"
    rm -rf "$WORK/chk"
  done
done
python3 - "$WORK/results" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    mode, wall, rss = line.split()
    runs.setdefault(mode, []).append((float(wall), int(rss)))
base = statistics.median(w for w, _ in runs["none"])
base_rss = statistics.median(r for _, r in runs["none"])
for mode in ("none", "full", "incremental"):
    walls = [w for w, _ in runs[mode]]
    rss = statistics.median(r for _, r in runs[mode])
    median = statistics.median(walls)
    print(f"{mode:12} median {median:5.2f} s ({100 * (median / base - 1):+5.1f} %)  runs "
          + " ".join(f"{w:.2f}" for w in walls) + f"  peak RSS {rss / 1024:.0f} MB ({rss / base_rss:.2f}x)")
PY
