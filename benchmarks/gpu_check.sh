#!/usr/bin/env bash
# The GPU checks, in one call of a device machine (see docs/benchmarks.md §9):
#   0. build the C helper for that machine's python
#   1. the CUDA tests of the core (pinned and device tiers, staging, mapped access, device delivery),
#      then the rest of the core with CUDA present
#   2. `conduit probe` (this machine's tiers and links)
#   3. benchmarks/buffer/frame_decode.py --device cuda (Atari stacks: uint8 to the GPU, decoded there)
#   4. benchmarks/buffer/gpu_tiers.py (delivery per placement)
# Outputs go to ${OUT:-out/gpu}: build.log, pytest_gpu.log, topology.json, probe.log, frame_decode.log,
# gpu_tiers.json, bench.log. Needs python3 with torch (CUDA), numpy, pytest, hypothesis, scipy and a C
# compiler; no RL framework. Each step has its own time limit so one hang cannot eat the lease.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}; mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/adapters PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
PY=${PY:-python3}
T0=$SECONDS
step() { echo "=== [$((SECONDS - T0)) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv
$PY -c "import sys, torch, numpy; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0), 'numpy', numpy.__version__)"
step "0. build the C helper"
timeout 120 $PY setup.py build_ext --inplace -q >"$OUT/build.log" 2>&1 || { echo "build failed:"; tail -20 "$OUT/build.log"; }
step "1. tests"
timeout 90 $PY -m pytest -q -p no:randomly -p no:cacheprovider tests/core/test_gpu_delivery.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -30
timeout ${TESTS_TIMEOUT:-180} $PY -m pytest -q -p no:randomly -p no:cacheprovider tests/core -k "not test_gpu_delivery" \
    2>&1 | tail -25 | tee -a "$OUT/pytest_gpu.log"
step "2. probe"
timeout 90 $PY -m conduit_core.cli probe --out "$OUT/topology.json" 2>&1 | tee "$OUT/probe.log" | tail -30
step "3. frame decode to the GPU"
timeout 90 $PY -m benchmarks.buffer.frame_decode --device cuda --batch 32 256 --reps 30 2>&1 | tee "$OUT/frame_decode.log"
step "4. delivery per placement"
timeout ${BENCH_TIMEOUT:-200} $PY -m benchmarks.buffer.gpu_tiers --topology "$OUT/topology.json" --out "$OUT/gpu_tiers.json" \
    ${BENCH_ARGS:---dims 128 1000 --batch 256 4096 --rounds 3 --reps 10} 2>&1 | tee "$OUT/bench.log" | tail -60
step "done"
