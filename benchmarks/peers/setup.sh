#!/usr/bin/env bash
# Creates benchmarks/peers/.venv with the peers (requirements.txt) and satchel (editable, no deps).
#   bash benchmarks/peers/setup.sh
# PYTHON picks the interpreter (3.11+). torch must be a CPU build: pip takes a local
# torch-2.13.0+cpu wheel where one is offered (find-links); elsewhere PyPI's Linux torch is the
# CUDA build, so set TORCH_INDEX to an index that serves PyTorch's CPU builds.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
"${PYTHON:-python3}" -m venv "$here/.venv"
pip=("$here/.venv/bin/python" -m pip)
"${pip[@]}" install --quiet pip==26.3

torch=(torch==2.13.0)
if [[ -n "${TORCH_INDEX:-}" ]]; then torch+=(--extra-index-url "$TORCH_INDEX"); fi
chosen="$("${pip[@]}" install --quiet --dry-run --no-deps --report - "${torch[@]}" |
  "$here/.venv/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["install"][0]["metadata"]["version"])')"
if [[ "$chosen" != *+cpu ]]; then
  echo "setup.sh: pip would install torch $chosen, not a CPU build; set TORCH_INDEX (see above)" >&2
  exit 1
fi
"${pip[@]}" install "${torch[@]}"
"${pip[@]}" install -r "$here/requirements.txt"
"${pip[@]}" install --no-deps -e "$repo"
echo "ready: $here/.venv/bin/python $here/run.py"
