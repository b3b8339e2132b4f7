#!/usr/bin/env bash
# Times the counter benchmark of the working tree (HEAD plus uncommitted changes) against a
# base revision, both built the same way (release profile) and run alternately on the same
# machine in one sitting, so noise from other load hits both alike.
#
#   bench/compare.sh HEAD~1          # a committed hot-path change against its parent
#   bench/compare.sh HEAD            # uncommitted changes against the last commit
#   RUNS=9 bench/compare.sh 4900891  # more rounds (default 5)
#
# Each round runs every workload once per binary and parallelism (P = 1 and 2), the order of
# the two binaries swapped every round. WORKLOADS (default "counter") picks them:
#
#   counter               weir run -p P counter --users 100000 --events 20000000 --output none
#   counter-checkpointed  the same with a checkpoint every 200 ms (incremental, to a local dir)
#   wordcount             weir run -p P wordcount over a 100 MB text (bench/make-text.py)
#   nexmark-q5            weir run -p P nexmark --query q5 --events 10000000 --output none
#   nexmark-q11           the same with q11 (session windows)
#
#   WORKLOADS="counter counter-checkpointed wordcount nexmark-q5" bench/compare.sh HEAD~1
#
# Printed per workload, parallelism and binary: median and minimum wall time, median
# voluntary context switches (how often the tasks' threads block on each other: on an idle
# machine a steady sign of a hand-off change; other load lowers it), and the ratio working
# tree / base.
#
# The base is built in a temporary git worktree under target/compare/ (its registration is
# removed afterwards, even on failure) with its own target directory there, and the binary
# is kept per commit: a second comparison against the same base builds only the working
# tree. Environment: RUNS, WORKLOADS, EVENTS and USERS (the counters), NEXMARK_EVENTS,
# PARALLELISM ("1 2"), COMPARE_DIR (target/compare), WAIT_IDLE (seconds to wait, before each round, for a machine shared with
# other work to be 85 % idle; 0 by default).
set -euo pipefail

usage() {
  echo "usage: [RUNS=N] $0 BASE_REV   (e.g. HEAD~1)" >&2
  exit 2
}
[ $# -eq 1 ] || usage
case "$1" in -h | --help) usage ;; esac

cd "$(dirname "$0")/.."
ROOT=$(pwd)
RUNS="${RUNS:-5}"
EVENTS="${EVENTS:-20000000}"
USERS="${USERS:-100000}"
PARALLELISM="${PARALLELISM:-1 2}"
WORKLOADS="${WORKLOADS:-counter}"
NEXMARK_EVENTS="${NEXMARK_EVENTS:-10000000}"
TEXT="${TMPDIR:-/tmp}/weir-bench-100mb.txt"
for workload in $WORKLOADS; do
  case "$workload" in
    counter | counter-checkpointed | wordcount | nexmark-q5 | nexmark-q11) ;;
    *) echo "$0: unknown workload '$workload' (counter, counter-checkpointed, wordcount, nexmark-q5, nexmark-q11)" >&2; exit 2 ;;
  esac
done
WAIT_IDLE="${WAIT_IDLE:-0}"
CACHE="${COMPARE_DIR:-$ROOT/target/compare}"
TIME=/usr/bin/time
[ -x "$TIME" ] || { echo "$0: needs GNU time at $TIME (apt-get install time)" >&2; exit 1; }
command -v bc >/dev/null || { echo "$0: needs bc" >&2; exit 1; }
command -v flock >/dev/null || { echo "$0: needs flock (util-linux)" >&2; exit 1; }
case "$RUNS" in '' | *[!0-9]* | 0) echo "$0: RUNS must be a positive number" >&2; exit 2 ;; esac
case "$WAIT_IDLE" in '' | *[!0-9]*) echo "$0: WAIT_IDLE must be a number of seconds" >&2; exit 2 ;; esac

base_sha=$(git rev-parse --verify --quiet "$1^{commit}") || { echo "$0: no such revision: $1" >&2; exit 2; }
base_short=$(git rev-parse --short "$base_sha")
mkdir -p "$CACHE"
# One comparison at a time per cache: they share the worktree path and the build directory.
exec 9>"$CACHE/lock"
flock -n 9 || { echo "$0: another comparison is using $CACHE" >&2; exit 1; }

worktree="$CACHE/src"
logs=$(mktemp -d "${TMPDIR:-/tmp}/weir-compare.XXXXXX")
remove_worktree() {
  if git -C "$ROOT" worktree list --porcelain | grep -qx "worktree $worktree"; then
    git -C "$ROOT" worktree remove --force "$worktree" >/dev/null 2>&1 || true
  fi
  rm -rf "$worktree"
  git -C "$ROOT" worktree prune
}
cleanup() {
  remove_worktree
  rm -rf "$logs"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

base_bin="$CACHE/weir-$base_sha"
if [ ! -x "$base_bin" ]; then
  echo "building base $base_short in $worktree (log: $CACHE/build-$base_short.log) ..."
  remove_worktree # left over from a run that was killed
  git -C "$ROOT" worktree add --detach "$worktree" "$base_sha" >/dev/null 2>&1
  if ! (cd "$worktree" && CARGO_TARGET_DIR="$CACHE/target" cargo build --release -p weir-cli) \
    >"$CACHE/build-$base_short.log" 2>&1; then
    echo "$0: building $base_short failed; the end of the log:" >&2
    tail -20 "$CACHE/build-$base_short.log" >&2
    exit 1
  fi
  cp "$CACHE/target/release/weir" "$base_bin.tmp"
  mv "$base_bin.tmp" "$base_bin"
  remove_worktree
fi

echo "building the working tree ($(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' + changes')) ..."
if ! cargo build --release -p weir-cli >"$logs/build-head.log" 2>&1; then
  echo "$0: building the working tree failed; the end of the log:" >&2
  tail -20 "$logs/build-head.log" >&2
  exit 1
fi
# A copy: a build started meanwhile (another shell) cannot swap the binary mid-comparison.
head_bin="$logs/weir-head"
cp "${CARGO_TARGET_DIR:-$ROOT/target}/release/weir" "$head_bin"

case " $WORKLOADS " in *" wordcount "*) [ -f "$TEXT" ] || python3 bench/make-text.py 100 "$TEXT" >/dev/null ;; esac

# The job of workload $1 (arguments after `weir run -D rest.port=0 -p P`), and what one run
# processes (events, or MB for wordcount).
job_args() {
  case "$1" in
    counter) echo "counter --users $USERS --events $EVENTS --output none" ;;
    counter-checkpointed)
      echo "-D execution.checkpointing.interval=200ms -D execution.checkpointing.incremental=true" \
        "-D state.checkpoints.dir=file://$logs/chk counter --users $USERS --events $EVENTS --output none"
      ;;
    wordcount) echo "wordcount --input $TEXT --output $logs/wordcount-out" ;;
    nexmark-q5 | nexmark-q11) echo "nexmark --query ${1#nexmark-} --events $NEXMARK_EVENTS --output none" ;;
  esac
}
work_of() {
  case "$1" in
    counter | counter-checkpointed) echo "$EVENTS / 1000000" ;;
    wordcount) du -m "$TEXT" | cut -f1 ;;
    nexmark-q5 | nexmark-q11) echo "$NEXMARK_EVENTS / 1000000" ;;
  esac
}
unit_of() { [ "$1" = wordcount ] && echo "MB/s" || echo "M events/s"; }

# run WORKLOAD NAME BINARY P: one timed run, appending "wall-seconds vol-ctxsw" to
# $logs/WORKLOAD-NAME-pP (the wall time from the clock, to the millisecond; GNU time counts
# the context switches).
run() {
  local workload=$1 name=$2 bin=$3 p=$4 start end
  rm -rf "$logs/chk" "$logs/wordcount-out"
  start=$(date +%s.%N)
  # shellcheck disable=SC2046 # the job's arguments are words
  if ! "$TIME" -o "$logs/time" -f "%w %U %S" "$bin" run -D rest.port=0 -p "$p" $(job_args "$workload") \
    >"$logs/run.log" 2>&1; then
    echo "$0: the $name binary failed ($workload, p=$p); its output:" >&2
    tail -20 "$logs/run.log" >&2
    exit 1
  fi
  end=$(date +%s.%N)
  read -r switches user system < <(tail -1 "$logs/time")
  echo "$(echo "$end - $start" | bc -l) $switches" >>"$logs/$workload-$name-p$p"
  echo "$user + $system" >>"$logs/cpu"
}

# CPU seconds all processes spent since boot (user, nice, system, irq, softirq, steal).
busy_seconds() {
  local stat
  read -ra stat < <(head -1 /proc/stat)
  echo "(${stat[1]} + ${stat[2]} + ${stat[3]} + ${stat[6]} + ${stat[7]} + ${stat[8]}) / $(getconf CLK_TCK)" | bc -l
}

median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
minimum() { sort -n | head -1; }

# Percent of the machine idle over one second (other work while timing makes numbers noisy).
idle_percent() {
  local before after total=0 i
  read -ra before < <(head -1 /proc/stat)
  sleep 1
  read -ra after < <(head -1 /proc/stat)
  for i in 1 2 3 4 5 6 7 8; do total=$((total + after[i] - before[i])); done
  echo $((100 * (after[4] - before[4]) / (total > 0 ? total : 1)))
}

# With WAIT_IDLE=SECONDS, waits up to that long for the machine to be 85 % idle; prints the idle
# percentage.
await_idle() {
  local idle waited=0
  idle=$(idle_percent)
  while [ "$idle" -lt 85 ] && [ "$waited" -lt "$WAIT_IDLE" ]; do
    idle=$(idle_percent)
    waited=$((waited + 1))
  done
  echo "$idle"
}

idle=$(await_idle)
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); idle before timing: $idle %"
[ "$idle" -ge 85 ] || echo "warning: other work is running; the times will be noisy (WAIT_IDLE=600 waits for quiet)"
echo "workloads: $WORKLOADS; $RUNS alternating runs per binary"
busy_before=$(busy_seconds)
started=$(date +%s.%N)
for round in $(seq "$RUNS"); do
  [ "$WAIT_IDLE" -eq 0 ] || [ "$round" -eq 1 ] || await_idle >/dev/null
  for workload in $WORKLOADS; do
    for p in $PARALLELISM; do
      if [ $((round % 2)) -eq 1 ]; then
        run "$workload" base "$base_bin" "$p"
        run "$workload" head "$head_bin" "$p"
      else
        run "$workload" head "$head_bin" "$p"
        run "$workload" base "$base_bin" "$p"
      fi
    done
  done
  printf '.'
done
# What the machine did besides the benchmark while it was timed: other load skews the times.
others=$(echo "$(busy_seconds) - $busy_before - ($(paste -sd+ "$logs/cpu"))" | bc -l)
share=$(echo "s = 100 * $others / ($(date +%s.%N) - $started); if (s < 0) s = 0; s" | bc -l)
printf ' other processes used %.0f %% of a core meanwhile%s\n' "$share" \
  "$([ "$(echo "$share > 10" | bc -l)" -eq 1 ] && echo ': the times are skewed, run again when quiet' || true)"

declare -A wall_median wall_min
for workload in $WORKLOADS; do
  work=$(work_of "$workload")
  for p in $PARALLELISM; do
    echo "$workload p=$p"
    printf '  %-22s %10s %10s %12s %14s\n' "" "median s" "min s" "$(unit_of "$workload")" "vol. ctxsw"
    for name in base head; do
      label=$([ "$name" = base ] && echo "base $base_short" || echo "working tree")
      wall_median[$name]=$(cut -d' ' -f1 "$logs/$workload-$name-p$p" | median)
      wall_min[$name]=$(cut -d' ' -f1 "$logs/$workload-$name-p$p" | minimum)
      switches=$(cut -d' ' -f2 "$logs/$workload-$name-p$p" | median)
      printf '  %-22s %10.3f %10.3f %12.1f %14.0f\n' "$label" "${wall_median[$name]}" "${wall_min[$name]}" \
        "$(echo "($work) / ${wall_median[$name]}" | bc -l)" "$switches"
    done
    printf '  %-22s %10.2f %10.2f   (below 1: the working tree is faster)\n' "working tree / base" \
      "$(echo "${wall_median[head]} / ${wall_median[base]}" | bc -l)" \
      "$(echo "${wall_min[head]} / ${wall_min[base]}" | bc -l)"
  done
done
