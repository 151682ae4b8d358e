#!/usr/bin/env bash
# The GPU checks, in one call of a device machine (see docs/benchmarks.md §9):
#   the CUDA tests of the core (pinned and device tiers, staging, mapped access, device delivery),
#   `conduit probe` (this machine's tiers and links), and benchmarks/bench_gpu_tiers.py.
# Outputs go to ${OUT:-out/gpu}: pytest_gpu.log, topology.json, gpu_tiers.json, bench.log.
# Needs python3 with torch (CUDA), numpy, pytest, hypothesis, scipy; no RL framework.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}; mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/adapters PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
PY=${PY:-python3}
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv
$PY -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0), 'numpy', numpy.__version__)"
# 1. tests: the GPU file first (fast failure), then the rest of the core with CUDA present
timeout 60 $PY -m pytest -q -p no:randomly -p no:cacheprovider tests/core/test_gpu_delivery.py 2>&1 | tee "$OUT/pytest_gpu.log"
timeout 240 $PY -m pytest -q -p no:randomly -p no:cacheprovider -x tests/core -k "not test_gpu_delivery" \
    2>&1 | tail -25 | tee -a "$OUT/pytest_gpu.log"
# 2. the machine's tiers and links
timeout 120 $PY -m conduit_core.cli probe --out "$OUT/topology.json" 2>&1 | tee "$OUT/probe.log"
# 3. delivery per placement (falls back to the placements that work if one fails)
timeout ${BENCH_TIMEOUT:-300} $PY -m benchmarks.bench_gpu_tiers --topology "$OUT/topology.json" --out "$OUT/gpu_tiers.json" \
    ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
