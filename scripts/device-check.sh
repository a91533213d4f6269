#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool): CUDA tests, CPU tests, benchmarks, with logs under
# $OUT and a short table last. Takes binaries built on the CPU machine (see DEVICE.md's recipe):
#   mkdir -p dev-out/bin && cp build-cuda/forge build-cuda/tests/forge_cuda_tests dev-out/bin/
#   device run: bash scripts/device-check.sh dev-out/bin   (carry: ["dev-out"])
set -uo pipefail
bin=${1:-dev-out/bin}
out=${OUT:-/tmp/forge-device}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
# Debian-built binaries: carry OpenBLAS and its Fortran runtime in case the image lacks them.
[[ -d dev-out/lib ]] && export LD_LIBRARY_PATH="$PWD/dev-out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/gpu.txt"
status=0
if [[ -x $bin/forge_cuda_tests ]]; then
  "$bin/forge_cuda_tests" 2>&1 | tee "$out/cuda_tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|tests ran" || status=1
fi
if [[ -x $bin/forge_tests ]]; then
  (cd "$(dirname "$0")/.." && "$bin/forge_tests" 2>&1 | tee "$out/cpu_tests.log" | tail -3) || status=1
fi
for b in ${FORGE_BENCHES:-}; do
  "$bin/forge" bench $b 2>&1 | tee "$out/bench_$b.log"
done
exit $status
