#!/usr/bin/env bash
# GPU run (the `device` tool, carry: ["dev-out"]): the whole CUDA test suite under
# compute-sanitizer, the tools side by side, each tool's run split into gtest shards that also
# run side by side (the sanitizers are bound by the host CPU; the GPU machine has 16 cores):
#   FORGE_SANITIZERS="memcheck synccheck" bash scripts/device-sanitize.sh dev-out/bin
# Settings: FORGE_SANITIZERS (tools, default memcheck), FORGE_SHARDS (default 16),
# FORGE_SANITIZE_LIMIT (seconds a shard may run, default 240), FORGE_SANITIZE_PRINT_LIMIT (reports
# a shard prints, default 50), FORGE_SANITIZE_FILTER (gtest
# filter, default all but the death tests: their forked children hang under the sanitizer, and
# they check host-side refusals, which the CPU suite's ASan run covers). cuBLASLt's own GEMM
# kernels (nvjet_*: FORGE_SANITIZE_EXCLUDE) are not checked: they are NVIDIA's, and racecheck
# flags their deliberate shared-memory reuse. initcheck alone keeps them: it must see their
# writes, or every read of a GEMM's output looks like a read of uninitialized memory.
# Prints per tool: tests run / passed / failed, shards cut off by the limit (and the test each
# was in), and the sanitizer's error count summed over the shards; logs under $OUT.
set -uo pipefail
bin=${1:-dev-out/bin}
out=${OUT:-/tmp/forge-device}
mkdir -p "$out"
[[ -f dev-out/bundle.tar.xz && ! -x $bin/forge_cuda_tests ]] && tar -xJf dev-out/bundle.tar.xz -C dev-out
[[ -d dev-out/lib ]] && export LD_LIBRARY_PATH="$PWD/dev-out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="/usr/local/cuda/bin:$PATH" NCCL_NVLS_ENABLE=0
shards=${FORGE_SHARDS:-16}
limit=${FORGE_SANITIZE_LIMIT:-240}
compute-sanitizer --version | tail -1
start=$(date +%s)
tools=${FORGE_SANITIZERS:-memcheck}
for tool in $tools; do
  exclude=(--kernel-name-exclude "${FORGE_SANITIZE_EXCLUDE:-kns=nvjet}")
  [[ $tool == initcheck ]] && exclude=()
  for ((i = 0; i < shards; ++i)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "$limit" compute-sanitizer --tool "$tool" \
      --print-limit "${FORGE_SANITIZE_PRINT_LIMIT:-50}" "${exclude[@]}" \
      "$bin/forge_cuda_tests" --gtest_filter="${FORGE_SANITIZE_FILTER:--*DeathTest*}" \
      > "$out/$tool.$i.log" 2>&1 &
  done
done
wait
for tool in $tools; do
  ok=$(cat "$out/$tool".*.log | grep -c '^\[       OK \]')
  failed=$(cat "$out/$tool".*.log | grep -c '^\[  FAILED  \] [A-Za-z]')
  skipped=$(cat "$out/$tool".*.log | grep -c '^\[  SKIPPED \] [A-Za-z]')
  errors=$(cat "$out/$tool".*.log | grep -E 'ERROR SUMMARY: [0-9]+' -o | awk '{s += $3} END {print s + 0}')
  hazards=$(cat "$out/$tool".*.log | grep -E 'RACECHECK SUMMARY: [0-9]+ hazard' -o | awk '{s += $3} END {print s + 0}')
  echo "== $tool: $(($(date +%s) - start)) s, tests ok $ok, failed $failed, skipped $skipped," \
    "error summary $errors${hazards:+, hazards $hazards}"
  for ((i = 0; i < shards; ++i)); do
    log="$out/$tool.$i.log"
    if ! grep -q '^\[  PASSED  \]\|^\[==========\] .* ran' "$log"; then
      echo "  shard $i cut off in: $(grep -E '^\[ RUN      \]' "$log" | tail -1 | cut -c14-)"
    fi
  done
  cat "$out/$tool".*.log | grep -E '^\[  FAILED  \] [A-Za-z]' | sort -u | head -20
  cat "$out/$tool".*.log | grep -E '^========= (Invalid|Uninitialized|Race|Barrier|Error|Warning|Program hit)' \
    | sed 's/0x[0-9a-f]*/0x…/g' | sort | uniq -c | sort -rn | head -20
  cat "$out/$tool".*.log | grep -E '^=========     (at|in) ' | sed 's/0x[0-9a-f]*/0x…/g' | sort | uniq -c \
    | sort -rn | head -20
done
