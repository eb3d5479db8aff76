#!/usr/bin/env bash
# satchel beside the peers on the LoCoMo dev data, one table, one command (after scripts/setup
# and benchmarks/peers/setup.sh): satchel's own evaluation in the project's .venv, then the
# peers in theirs (Mem0 and satchel's server need protobuf versions that cannot share one).
#   bash benchmarks/peers/compare.sh [--json]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
report="$(mktemp --suffix=.json)"
trap 'rm -f "$report"' EXIT
.venv/bin/satchel eval locomo --json --no-baselines > "$report"
benchmarks/peers/.venv/bin/python benchmarks/peers/run.py --satchel "$report" "$@"
