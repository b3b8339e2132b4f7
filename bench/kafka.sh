#!/usr/bin/env bash
# Kafka (issue 13): weir's KafkaSource feeding the counter into a discard sink, against a bare
# librdkafka consumer reading the same topic from the same broker (noida-db). Both read
# read_committed (librdkafka's default) from the earliest offset. Release build.
#
#   bench/kafka.sh            # EVENTS=2000000 PARTITIONS=4 by default
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${EVENTS:-2000000}
PARTITIONS=${PARTITIONS:-4}
NOIDA=${WEIR_NOIDA_DB:-$(ls .ci/venv/lib/python3*/site-packages/noida_db/noida-db 2>/dev/null | head -1)}
[ -x "$NOIDA" ] || { echo "noida-db missing: python3 -m venv .ci/venv && .ci/venv/bin/pip install noida-db==0.2.3"; exit 1; }
cargo build --release -p weir-cli >/dev/null 2>&1
cargo build --release -p weir-connectors --example kafka_tool >/dev/null 2>&1
W=$PWD/target/release/weir
T=$PWD/target/release/examples/kafka_tool
WORK=$(mktemp -d)
PORT=19292
"$NOIDA" start --only kafka --data-dir "$WORK/noida" --host 127.0.0.1 --kafka-port $PORT >/dev/null 2>&1 &
BROKER=$!
trap 'kill $BROKER 2>/dev/null || true; rm -rf "$WORK"' EXIT
B=127.0.0.1:$PORT
until (echo > /dev/tcp/127.0.0.1/$PORT) 2>/dev/null; do sleep 0.05; done

"$T" create $B events $PARTITIONS
"$T" produce $B events "$EVENTS" 100000
echo "== bare librdkafka consumer, $EVENTS records, $PARTITIONS partitions"
"$T" consume $B events "$EVENTS"
for p in 1 2; do
  echo "== weir: Kafka -> counter (100 000 users) -> discard, p=$p"
  start=$(date +%s.%N)
  "$W" run -p $p counter --input "kafka://$B/events?bounded=true" --output none >/dev/null
  end=$(date +%s.%N)
  python3 -c "d=$end-$start; print(f'weir p=$p: $EVENTS records in {d:.2f} s (process start to end): {$EVENTS/d:.0f} records/s')"
done

echo "== end-to-end latency: produce -> counter (1 s checkpoints) -> read_committed visibility"
"$T" create $B probes 2
"$T" create $B probe-counts 2
"$W" run -p 2 -D rest.port=18997 -D execution.checkpointing.interval=1s counter \
  --input "kafka://$B/probes?starting-offsets=latest" --output "kafka://$B/probe-counts" >/dev/null 2>&1 &
JOB=$!
sleep 3
"$T" latency $B probes probe-counts 100
kill $JOB 2>/dev/null || true
