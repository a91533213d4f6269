#!/usr/bin/env bash
# GPU run for Qwen3's head norm + RoPE work splits (issue 13; HeadNormRopeSplit,
# ops/head_norm_rope.h), after scripts/device-bundle.sh here. One binary measures both splits,
# chosen by FORGE_HEAD_NORM_ROPE=head|position:
#  1. the CUDA tests of the op and of the Qwen3 model paths (both splits against the CPU twin and
#     against each other: x, rstd and d(x_raw) must be the same bits);
#  2. `forge bench train --preset llama-100m --batch 32 --seq-len 2048`, alternating plain Llama,
#     qwen3 per head and qwen3 per position, ROUNDS times (default 2);
#  3. with TIMELINE=1, dev/train_timeline's CSV of qwen3 under each split ($OUT/qwen3-head.csv,
#     $OUT/qwen3-position.csv: compare with dev/timeline_diff.py).
# Usage (device run, carry dev-out): bash scripts/device-head-norm.sh
set -uo pipefail
out=${OUT:-/tmp/forge-device}
mkdir -p "$out"
[[ -f dev-out/bundle.tar.xz ]] && tar -xJf dev-out/bundle.tar.xz -C dev-out
export LD_LIBRARY_PATH="$PWD/dev-out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin=dev-out/bin
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
"$bin/forge_cuda_tests" --gtest_filter='*HeadNormRope*:*Qwen3*:*qwen3*:*HfGolden*' 2>&1 \
  | tee "$out/head_norm_tests.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran|Failure" || status=1
shape=(--preset llama-100m --batch 32 --seq-len 2048)
for r in $(seq "${ROUNDS:-2}"); do
  for run in plain qwen3:head qwen3:position; do
    variant=${run%%:*} split=${run#*:}
    [[ $run == plain ]] && split=head
    set_flags=()
    [[ $variant == qwen3 ]] && set_flags=(--set variant=qwen3)
    line=$(FORGE_HEAD_NORM_ROPE=$split "$bin/forge" bench train "${shape[@]}" "${set_flags[@]}" 2>&1 \
      | tee -a "$out/bench.log" | grep -E "tokens/s|^\|" | tail -1)
    echo "round $r  $run: $line"
  done
done
if [[ ${TIMELINE:-0} == 1 && -x $bin/train_timeline ]]; then
  for split in head position; do
    FORGE_HEAD_NORM_ROPE=$split "$bin/train_timeline" "${shape[@]}" --set variant=qwen3 \
      --csv "$out/qwen3-$split.csv" > "$out/timeline-$split.log" 2>&1 || status=1
    tail -3 "$out/timeline-$split.log"
  done
fi
exit $status
