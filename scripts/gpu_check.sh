#!/usr/bin/env bash
# The first-GPU check (issue 42, < 8 minutes on one GPU, no internet): tiny and LlamaGen-XL-shaped random models,
# tokens/s eager vs compiled, AR vs chain vs static tree vs dynamic tree, ops and syncs per token, predicted vs
# measured speed-up; one JSON file and a table.
#   bash scripts/gpu_check.sh                          # on a machine with a CUDA GPU (writes gpu_check.json)
#   bash scripts/gpu_check.sh --device cpu --dry-run   # tiny shapes on CPU, to check the script (--cpu-smoke: same)
#   bash scripts/gpu_check.sh --forward [--cpu-smoke]  # forward timings, per-round overhead, batch curve
#   bash scripts/gpu_check.sh --lumina [--cpu-smoke]   # Lumina-mGPT-7B-shaped Chameleon through transformers
# Extra flags go to scripts/gpu_check.py (--out, --tokens, --models, --compile-mode, --budget-s, ...), after
# --forward to scripts/gpu_check_forward.py, after --lumina to scripts/gpu_check_lumina.py.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"     # the interpreter: $PYTHON (the tests pass theirs), else python from PATH
if [[ "${1:-}" == "--lumina" ]]; then
  shift
  exec "$PY" "$ROOT/scripts/gpu_check_lumina.py" "$@"
fi
if [[ "${1:-}" == "--forward" ]]; then
  shift
  exec "$PY" "$ROOT/scripts/gpu_check_forward.py" "$@"
fi
exec "$PY" "$ROOT/scripts/gpu_check.py" "$@"
