#!/usr/bin/env bash
# The same Nexmark queries on Apache Flink 2.3 and on weir, on this machine, in one sitting:
# bench/flink-nexmark/NexmarkFlink.java (weir's queries and generator ported to Flink's
# DataStream API, run on Flink's local MiniCluster) against `weir run nexmark`. Output is
# discarded in both. Flink's time is its job's net runtime (JVM and MiniCluster start-up
# left out, in Flink's favour); weir's is the whole process. Needs Java 17 and Flink's
# distribution (`.ci/test` installs it into .ci/venv; or set WEIR_FLINK_HOME).
#
#   bench/flink-nexmark.sh                       # 10,000,000 events, every query, p=1
#   EVENTS=2000000 P=2 bench/flink-nexmark.sh q5
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS="${EVENTS:-10000000}"
P="${P:-1}"
QUERIES=("$@")
[ ${#QUERIES[@]} -gt 0 ] || QUERIES=(q0 q1 q2 q3 q4 q5 q7 q8 q11)
FLINK_HOME="${WEIR_FLINK_HOME:-$(ls -d .ci/venv/lib/python3*/site-packages/pyflink 2>/dev/null | head -1)}"
if [ ! -f "$FLINK_HOME/lib/flink-dist-2.3.0.jar" ]; then
  echo "error: no Flink 2.3 distribution at '${FLINK_HOME}': run .ci/test once (it installs apache-flink into .ci/venv) or set WEIR_FLINK_HOME" >&2
  exit 1
fi
cargo build --release -p weir-cli >/dev/null 2>&1
WEIR="${WEIR:-target/release/weir}"
build=target/flink-nexmark
rm -rf "$build/classes" && mkdir -p "$build/classes"
javac -nowarn -cp "$FLINK_HOME/lib/*" -d "$build/classes" bench/flink-nexmark/NexmarkFlink.java 2>&1 | grep -v '^Note:' || true
jar cf "$build/NexmarkFlink.jar" -C "$build/classes" .

rate() { echo "$EVENTS / $1 / 1000" | bc -l; }
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $EVENTS events, p=$P"
for query in "${QUERIES[@]}"; do
  ms=$(java -cp "$build/NexmarkFlink.jar:$FLINK_HOME/lib/*" NexmarkFlink "$query" "$EVENTS" "$P" 2>/dev/null \
    | sed -n 's/.*net_runtime_ms=\([0-9]*\).*/\1/p')
  start=$(date +%s%N)
  "$WEIR" run -D rest.port=0 -p "$P" nexmark --query "$query" --events "$EVENTS" --output none >/dev/null 2>&1
  weir_ms=$(( ($(date +%s%N) - start) / 1000000 ))
  printf '%-4s  flink %6.2f M events/s (%6d ms)   weir %6.2f M events/s (%6d ms)   weir/flink %5.1fx\n' \
    "$query" "$(rate "$ms")" "$ms" "$(rate "$weir_ms")" "$weir_ms" "$(echo "$ms / $weir_ms" | bc -l)"
done
