#!/usr/bin/env bash
# satchel beside the peers on the LoCoMo dev data, one table, one command (after scripts/setup
# and benchmarks/peers/setup.sh): satchel's own evaluation in the project's .venv, then the
# peers in theirs (Mem0 and satchel's server need protobuf versions that cannot share one).
#   bash benchmarks/peers/compare.sh [--json] [--systems txtai …] [--data PATH]
# --data: another LoCoMo file, or REALTALK's data folder (then `satchel eval realtalk`).
# satchel runs as it is deployed: a `satchel serve` process (embedded PostgreSQL on a scratch
# data directory, removed afterwards) that the harness calls over gRPC from its own process.
# SATCHEL_COMPARE_IN_PROCESS=1 runs the server inside the harness instead (one event loop for
# the client and the server: the figures before 2026-12-03).
# The peers are packed by their texts' tokens (characters / 4) into 900: satchel is measured
# under the same rule, SATCHEL_BUDGET_COUNTS=items (its default counts the rendered block, tags,
# dates and headers too: docs/context.md "Packing and the relevance floor").
set -euo pipefail
export SATCHEL_BUDGET_COUNTS=items
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
report="$(mktemp --suffix=.json)"
data=""
server=""
cleanup() {
  if [[ -n "$server" ]]; then kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true; fi
  if [[ -n "$data" ]]; then rm -rf "$data"; fi
  rm -f "$report"
}
trap cleanup EXIT

suite=(locomo)
args=("$@")
for i in "${!args[@]}"; do
  if [[ "${args[$i]}" == --data ]]; then
    given="${args[$((i + 1))]}"
    if [[ -d "$given" ]]; then suite=(realtalk); fi
    suite+=(--data "$given")
  fi
done

if [[ "${SATCHEL_COMPARE_IN_PROCESS:-0}" == 1 ]]; then
  .venv/bin/satchel eval "${suite[@]}" --json --no-baselines > "$report"
else
  data="$(mktemp -d /var/tmp/satchel-compare-XXXXXX)"
  port="$(.venv/bin/python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  SATCHEL_DATA_DIR="$data" SATCHEL_LISTEN="127.0.0.1:$port" SATCHEL_LOG_LEVEL=warning \
    .venv/bin/satchel serve > "$data/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 1 240); do
    if .venv/bin/satchel healthcheck --address "127.0.0.1:$port" 2>/dev/null | grep -q ' SERVING$'; then
      break
    fi
    kill -0 "$server" 2>/dev/null || { cat "$data/serve.log" >&2; exit 1; }
    sleep 0.5
  done
  .venv/bin/satchel eval "${suite[@]}" --address "127.0.0.1:$port" --json --no-baselines > "$report"
fi
benchmarks/peers/.venv/bin/python benchmarks/peers/run.py --satchel "$report" "$@"
