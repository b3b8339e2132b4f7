#!/usr/bin/env bash
# High availability costs (see bench/ha.py): leader failover time, records read while no
# leader existed, checkpoint duration with and without HA. Needs etcd (apt-get install -y etcd-server).
#
#   bench/ha.sh        # ROUNDS=5 by default
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p weir-cli >/dev/null 2>&1
exec python3 bench/ha.py
