#!/usr/bin/env bash
# Across machines (issue 26): real weir processes on the hosts of the multi-host test bed
# (network namespaces on one machine; crates/weir-cli/tests/common/netns.rs), release build.
# Needs root, iproute2, iptables and etcd (.ci/test installs them). Runs the ignored bench_*
# tests of crates/weir-cli/tests/multi_host.rs one at a time; each prints BENCH lines:
#
# - counter at p=4 (100 000 users, 100 M events, output none, no checkpoints) on a JobManager
#   and two 2-slot TaskManagers: on one host over loopback, on two TaskManager hosts directly,
#   and with each TaskManager's data port behind the harness's delay proxy at 0 ms and at
#   0.5 ms each way (1 ms round trip between the TaskManagers); throughput from the job's own
#   duration (submit to FINISHED, deploy included);
# - a TaskManager partitioned from both JobManagers until the job is RUNNING elsewhere
#   (heartbeat.timeout 5 s);
# - the leader partitioned from etcd: the old lease's expiry (the harness sees the leader key
#   go) until a standby leads and until the job is RUNNING, no task restarted;
# - SIGTERM of the leader until etcd names a standby, and until the job is RUNNING under it.
#
#   bench/multi-host.sh                 # WEIR_BENCH_ROUNDS=5 WEIR_BENCH_EVENTS=100000000
set -euo pipefail
cd "$(dirname "$0")/.."
export WEIR_BENCH_ROUNDS=${WEIR_BENCH_ROUNDS:-5}
export WEIR_BENCH_EVENTS=${WEIR_BENCH_EVENTS:-100000000}
cargo test --release -p weir-cli --test multi_host --no-run >/dev/null 2>&1
cargo test --release -p weir-cli --test multi_host -- --ignored --nocapture --test-threads 1 bench_ 2>&1 | grep -o 'BENCH.*\|panicked.*\|test result.*'
