#!/usr/bin/env bash
# GPU checks on one H200 (no registry, no real weights): random-weight models of real shapes, a draft
# with controlled acceptance, throughput against alpha, k and concurrency. Prints markdown tables.
# Runs in well under 8 minutes; needs torch with CUDA and this repository (pip install -e . --no-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
timeout 300 "$PY" -m specserve.bench.synthetic --target qwen2.5-1.5b --draft qwen2.5-0.5b --device cuda \
  --alphas 0.6 0.8 0.95 --ks 2 4 8 --concurrency 1 8 32 --prompt-len 128 --max-tokens 64
timeout 180 "$PY" -m specserve.bench.synthetic --target qwen2.5-7b --draft qwen2.5-0.5b --device cuda \
  --alphas 0.8 0.95 --ks 4 8 --concurrency 1 16 --prompt-len 128 --max-tokens 64
