#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool): CUDA tests, CPU tests, benchmarks, with logs under
# $OUT and a short table last. Takes binaries built on the CPU machine (see DEVICE.md's recipe):
#   mkdir -p dev-out/bin && cp build/forge build/tests/forge_cuda_tests dev-out/bin/
#   device run: bash scripts/device-check.sh dev-out/bin   (carry: ["dev-out"])
# A bundle (dev-out/bundle.tar.xz, holding bin/ and lib/) is unpacked first when present: the
# binaries and Debian's OpenBLAS compress 3×, which keeps the carried tree under 64 MiB.
# FORGE_BENCHES="train|--preset gpt2-124m;train|--preset smollm2-135m --batch 32 --seq-len 2048"
# runs each `forge bench` (';'-separated, '|' between the benchmark and its flags); with
# $bin/forge_base present (the build before a change) each runs on both builds, alternating,
# FORGE_BENCH_ROUNDS times (default 2), so the two figures come from one GPU run.
set -uo pipefail
bin=${1:-dev-out/bin}
out=${OUT:-/tmp/forge-device}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
# The CLI tests run this forge (tests/forge_bin.h), not the CPU machine's build path, which does
# not exist here; the golden data is read from this checkout.
export FORGE_TEST_BIN="$PWD/$bin/forge" FORGE_SOURCE_DIR="${FORGE_SOURCE_DIR:-$PWD}"
[[ -f dev-out/bundle.tar.xz ]] && tar -xJf dev-out/bundle.tar.xz -C dev-out
# Debian-built binaries: carry OpenBLAS and its Fortran runtime in case the image lacks them.
[[ -d dev-out/lib ]] && export LD_LIBRARY_PATH="$PWD/dev-out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$out/gpu.txt"
status=0
if [[ -x $bin/forge_cuda_tests ]]; then
  timeout "${FORGE_TEST_TIMEOUT:-400}" "$bin/forge_cuda_tests" ${FORGE_TEST_FILTER:+--gtest_filter=$FORGE_TEST_FILTER} 2>&1 \
    | tee "$out/cuda_tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|tests ran|Failure|error" || status=1
fi
if [[ -x $bin/forge_tests ]]; then
  (cd "$(dirname "$0")/.." && "$bin/forge_tests" 2>&1 | tee "$out/cpu_tests.log" | tail -3) || status=1
fi
rounds=${FORGE_BENCH_ROUNDS:-2}
IFS=';' read -ra benches <<< "${FORGE_BENCHES:-}"
for spec in "${benches[@]}"; do
  what=${spec%%|*}
  flags=${spec#*|}
  [[ $flags == "$spec" ]] && flags=""
  for r in $(seq "$rounds"); do
    for build in forge forge_base; do
      [[ -x $bin/$build ]] || continue
      echo "== $build bench $what $flags (round $r)" | tee -a "$out/bench.log"
      # shellcheck disable=SC2086
      "$bin/$build" bench $what $flags 2>&1 | tee -a "$out/bench.log" | grep -E "^forge " | tail -2
    done
  done
done
exit $status
