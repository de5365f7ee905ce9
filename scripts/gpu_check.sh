#!/usr/bin/env bash
# One-command timing check on a CUDA GPU (< 5 minutes): LlamaGen-XL-sized target and B-sized draft
# forwards (random weights, bf16) and the speculative engine's per-round overhead.
#   bash scripts/gpu_check.sh              # on a machine with a CUDA GPU
#   bash scripts/gpu_check.sh --cpu-smoke  # tiny configs on CPU, to check the script itself
#   bash scripts/gpu_check.sh --lumina [--cpu-smoke]  # Lumina-mGPT-7B-shaped Chameleon through transformers
# Extra flags go to scripts/gpu_check.py (--target, --draft, --image-size, --L, --iters, --json, ...) or,
# after --lumina, to scripts/gpu_check_lumina.py (--tokens, --context, --draft-layers, ...).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"     # the interpreter: $PYTHON (the tests pass theirs), else python from PATH
if [[ "${1:-}" == "--lumina" ]]; then
  shift
  exec "$PY" "$ROOT/scripts/gpu_check_lumina.py" "$@"
fi
exec "$PY" "$ROOT/scripts/gpu_check.py" "$@"
