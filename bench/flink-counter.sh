#!/usr/bin/env bash
# The counter (issue 30, item 1) on Apache Flink 2.3 and on weir, on this machine, in one
# sitting: bench/flink-counter/CounterFlink.java (weir's `counter` ported to Flink's
# DataStream API, on Flink's local MiniCluster, default heap state backend) against
# `weir run counter`, output discarded in both, runs alternating.
#
# Flink's number is its steady state: (LONG - EVENTS) / (net runtime of LONG events - net
# runtime of EVENTS events), so JVM start, MiniCluster start and JIT warm-up are left out (in
# Flink's favour). weir's is EVENTS over its whole process, start-up included.
# Needs Java 17 and Flink's distribution (`.ci/test` installs it into .ci/venv; or set
# WEIR_FLINK_HOME).
#
#   bench/flink-counter.sh                 # p=1 and p=2, 3 runs each, 20 M and 100 M events
#   RUNS=5 PS="1" bench/flink-counter.sh
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS="${EVENTS:-20000000}"
LONG="${LONG:-100000000}"
USERS="${USERS:-100000}"
RUNS="${RUNS:-3}"
PS="${PS:-1 2}"
FLINK_HOME="${WEIR_FLINK_HOME:-$(ls -d .ci/venv/lib/python3*/site-packages/pyflink 2>/dev/null | head -1)}"
if [ ! -f "$FLINK_HOME/lib/flink-dist-2.3.0.jar" ]; then
  echo "error: no Flink 2.3 distribution at '${FLINK_HOME}': run .ci/test once (it installs apache-flink into .ci/venv) or set WEIR_FLINK_HOME" >&2
  exit 1
fi
[ -n "${WEIR:-}" ] || cargo build --release -p weir-cli >/dev/null 2>&1
WEIR="${WEIR:-target/release/weir}"
build=target/flink-counter
rm -rf "$build/classes" && mkdir -p "$build/classes"
javac -nowarn -cp "$FLINK_HOME/lib/*" -d "$build/classes" bench/flink-counter/CounterFlink.java 2>&1 | grep -v '^Note:' || true
jar cf "$build/CounterFlink.jar" -C "$build/classes" .

flink_ms() {
  java -cp "$build/CounterFlink.jar:$FLINK_HOME/lib/*" CounterFlink "$1" "$USERS" "$2" 2>/dev/null \
    | sed -n 's/.*net_runtime_ms=\([0-9]*\).*/\1/p'
}
median() { sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); weir $($WEIR --version 2>/dev/null | head -1)"
echo "counter: $USERS users; Flink steady state from $EVENTS and $LONG events; weir whole process, $EVENTS events"
for p in $PS; do
  flink_rates=() weir_rates=()
  for run in $(seq "$RUNS"); do
    short=$(flink_ms "$EVENTS" "$p")
    long=$(flink_ms "$LONG" "$p")
    flink_rate=$(echo "($LONG - $EVENTS) / ($long - $short) / 1000" | bc -l)
    start=$(date +%s%N)
    "$WEIR" run -D rest.port=0 -p "$p" counter --users "$USERS" --events "$EVENTS" --output none >/dev/null 2>&1
    weir_ms=$(( ($(date +%s%N) - start) / 1000000 ))
    weir_rate=$(echo "$EVENTS / $weir_ms / 1000" | bc -l)
    printf 'p=%s run %s: flink %6.2f M events/s (net %d ms for %d, %d ms for %d)   weir %6.2f M events/s (%d ms)\n' \
      "$p" "$run" "$flink_rate" "$short" "$EVENTS" "$long" "$LONG" "$weir_rate" "$weir_ms"
    flink_rates+=("$flink_rate") weir_rates+=("$weir_rate")
  done
  f=$(printf '%s\n' "${flink_rates[@]}" | median)
  w=$(printf '%s\n' "${weir_rates[@]}" | median)
  printf 'p=%s median: flink %.2f M events/s, weir %.2f M events/s, weir/flink %.1fx\n' "$p" "$f" "$w" "$(echo "$w / $f" | bc -l)"
done
