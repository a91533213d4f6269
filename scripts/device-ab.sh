#!/usr/bin/env bash
# GPU run for the A/B settings of one binary (CudaSettings fields the CLI reads from the
# environment: FORGE_HEAD_NORM_ROPE=head|position, FORGE_ADAMW=tensor|multi,
# FORGE_WGRAD_FINISH=kernel|fused), after scripts/device-bundle.sh here:
#  1. the CUDA tests named in AB_TESTS (default: the head norm + RoPE splits, the golden models,
#     multi-tensor AdamW and fused finishing against the defaults, bit for bit);
#  2. `forge bench train` for every run of AB_RUNS, ROUNDS times (default 2), alternating, each
#     printing its tokens/s line; AB_RUNS is ';'-separated "label|ENV=VALUE ...|bench flags",
#     by default the runs of AB_SET (families: plain Llama and Qwen3; qwen2: plain Llama and
#     Qwen2; gpt2: GPT-2 and SmolLM2);
#  3. with TIMELINE="label ..." dev/train_timeline's CSV of those runs ($OUT/<label>.csv; compare
#     two with dev/timeline_diff.py).
# Usage (device run, carry dev-out): bash scripts/device-ab.sh
set -uo pipefail
out=${OUT:-/tmp/forge-device}
mkdir -p "$out"
[[ -f dev-out/bundle.tar.xz ]] && tar -xJf dev-out/bundle.tar.xz -C dev-out
export LD_LIBRARY_PATH="$PWD/dev-out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bin=dev-out/bin
status=0
llama="--preset llama-100m --batch 32 --seq-len 2048"
smol="--preset smollm2-135m --batch 32 --seq-len 2048"
new="FORGE_ADAMW=multi FORGE_WGRAD_FINISH=fused"  # the two settings that keep the same bits
case ${AB_SET:-families} in
  families)  # issue 13: Qwen3 against plain Llama, each with and without the new settings
    default_runs="plain||$llama;plain-new|$new|$llama"
    default_runs+=";qwen3-head||$llama --set variant=qwen3"
    default_runs+=";qwen3-position|FORGE_HEAD_NORM_ROPE=position|$llama --set variant=qwen3"
    default_runs+=";qwen3-new|FORGE_HEAD_NORM_ROPE=position $new|$llama --set variant=qwen3" ;;
  qwen2)  # issue 13: Qwen2 (q/k bias sums, now also finished in place) against plain Llama
    default_runs="plain||$llama;plain-new|$new|$llama"
    default_runs+=";qwen2||$llama --set variant=qwen2;qwen2-new|$new|$llama --set variant=qwen2" ;;
  gpt2)  # issue 16: GPT-2 124M and SmolLM2-135M, each setting alone and both
    default_runs="gpt2||--preset gpt2-124m;gpt2-multi|FORGE_ADAMW=multi|--preset gpt2-124m"
    default_runs+=";gpt2-fused|FORGE_WGRAD_FINISH=fused|--preset gpt2-124m"
    default_runs+=";gpt2-new|$new|--preset gpt2-124m"
    default_runs+=";smollm2||$smol;smollm2-new|$new|$smol" ;;
  *) echo "AB_SET: families, qwen2 or gpt2"; exit 2 ;;
esac
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
tests=${AB_TESTS-*HeadNormRope*:*HfGolden*:*AdamW*:*WgradFinish*:*AbSettings*}
if [[ -n $tests ]]; then
  "$bin/forge_cuda_tests" --gtest_filter="$tests" 2>&1 | tee "$out/ab_tests.log" \
    | grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran|Failure" || status=1
fi
IFS=';' read -ra runs <<< "${AB_RUNS:-$default_runs}"
for r in $(seq "${ROUNDS:-2}"); do
  for spec in "${runs[@]}"; do
    IFS='|' read -r label envs flags <<< "$spec"
    # shellcheck disable=SC2086
    line=$(env $envs "$bin/forge" bench train $flags 2>&1 | tee -a "$out/bench-$label.log" \
      | grep -E "^forge +(none|attn|mlp|full) " | tail -1)
    echo "round $r  $label: $line"
  done
done
for label in ${TIMELINE:-}; do
  for spec in "${runs[@]}"; do
    IFS='|' read -r l envs flags <<< "$spec"
    [[ $l == "$label" ]] || continue
    # shellcheck disable=SC2086
    env $envs "$bin/train_timeline" $flags --csv "$out/$label.csv" > "$out/timeline-$label.log" 2>&1 || status=1
    tail -2 "$out/timeline-$label.log"
  done
done
exit $status
