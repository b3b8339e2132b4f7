#!/usr/bin/env bash
# Upgrades through the deployment controller (see bench/deploy.py): apply -> new job RUNNING
# for a counter with 1 M keys, savepoint mode (p 2 -> 4) and last-state mode (p 4 -> 3).
#
#   bench/deploy.sh        # ROUNDS=3 by default
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p weir-cli >/dev/null 2>&1
exec python3 bench/deploy.py
