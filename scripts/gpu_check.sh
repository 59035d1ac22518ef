#!/usr/bin/env bash
# GPU checks on one H200 (no registry, no real weights): random-weight models of real shapes, a draft
# with controlled acceptance, throughput against alpha, k and concurrency, where decoding waits for the
# device, and whether outputs that part from target-only part at near-ties. Prints markdown tables; writes
# JSON and logs to $OUT (or /tmp/gpu-check). Each stage has its own time limit (7.8 minutes in all), and a
# stage cut short keeps the rows it printed. Needs torch with CUDA and this repository's dependencies but
# ray and gguf (run from the repository root, or pip install -e . --no-deps).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
RESULTS=${OUT:-/tmp/gpu-check}
mkdir -p "$RESULTS"
export CUDA_MODULE_LOADING=EAGER  # kernels load at start-up, not inside the first measured pass that uses them
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
          'transformers', transformers.__version__)" || exit 1

stage() {  # name, seconds, synthetic benchmark arguments
  local name=$1 limit=$2
  shift 2
  echo "## $name"
  timeout "$limit" "$PY" -m specserve.bench.synthetic --device cuda --json "$RESULTS/$name.json" "$@" \
    2>&1 | tee "$RESULTS/$name.log"
  local status=${PIPESTATUS[0]}
  [ "$status" -eq 0 ] || echo "$name: exit $status (124: cut at ${limit} s)"
}

stage smoke 60 --target tiny --draft tiny-draft --draft-caches slots growing --check-draft-steps 4 \
  --step-times 1 4 --alphas 0.9 --ks 4 --concurrency 1 4 --prompt-len 16 --max-tokens 16 || true
grep -q "^| 4 | 0.90 | 4 | growing" "$RESULTS/smoke.log" || { echo "smoke stage failed: stopping"; exit 1; }
# draft caches: "slots" (a slot pool, steps replayed as CUDA graphs) at every k; "growing" (a cache per
# session, eager steps: the first GPU run's draft) at k = 4 beside it
# target pass times by window (1: a target-only step; 5: a k = 4 verification) at batch 1, 8 and 32
stage qwen-1.5b-0.5b-bf16 210 --target qwen2.5-1.5b --draft qwen2.5-0.5b --sync-report \
  --check-draft-steps 8 --step-times 1 8 32 --verify-times 1 8 32 --draft-caches slots growing \
  --alphas 0.8 0.95 --ks 2 4 8 --concurrency 1 8 32 --prompt-len 128 --max-tokens 64
stage qwen-7b-0.5b-bf16 150 --target qwen2.5-7b --draft qwen2.5-0.5b --sync-report --verify-times 1 8 32 \
  --alphas 0.8 0.95 --ks 2 4 8 --concurrency 1 32 --prompt-len 128 --max-tokens 64
stage qwen-1.5b-0.5b-fp32 50 --target qwen2.5-1.5b --draft qwen2.5-0.5b --dtype float32 \
  --alphas 0.8 --ks 4 --concurrency 1 8 --prompt-len 128 --max-tokens 64
