#!/usr/bin/env bash
# GPU run for side-by-side training benchmarks of one binary, after scripts/device-bundle.sh here
# (an A/B setting is an environment variable the CLI reads into CudaSettings; 2026-12-05 had
# none left: the three measured that day were decided, docs/perf-notes.md):
#  1. the CUDA tests named in AB_TESTS (default: the head norm + RoPE op and the golden models);
#  2. `forge bench train` for every run of AB_RUNS, ROUNDS times (default 2), alternating, each
#     printing its tokens/s line; AB_RUNS is ';'-separated "label|ENV=VALUE ...|bench flags|suffix"
#     (suffix optional: "_base" or "_prev" runs forge_base / forge_prev and their train_timeline,
#     the earlier builds scripts/device-bundle.sh packs),
#     by default the runs of AB_SET (families: plain Llama, Qwen3 and Qwen2; gpt2: GPT-2 and
#     SmolLM2; gemm: GPT-2 124M, plain Llama and
#     SmolLM2 with FORGE_GEMM_ALGO=heuristic and =timed, after `forge bench gemm --algos` on each
#     of those shapes, written to $OUT/algos-<preset>.txt, `forge bench gemm --fp8` to
#     $OUT/fp8-<preset>.txt, and `forge bench generate` with each setting);
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
case ${AB_SET:-families} in
  families)  # issue 13: each family against plain Llama of the same shape
    default_runs="plain||$llama;qwen3||$llama --set variant=qwen3;qwen2||$llama --set variant=qwen2" ;;
  gpt2)  # issue 16: GPT-2 124M and SmolLM2-135M
    default_runs="gpt2||--preset gpt2-124m;smollm2||$smol" ;;
  gemm)  # FORGE_GEMM_ALGO=timed against the heuristic's first algorithm
    default_runs=""
    for spec in "gpt2|--preset gpt2-124m" "plain|$llama" "smollm2|$smol"; do
      default_runs+="${spec%%|*}||${spec#*|};${spec%%|*}-timed|FORGE_GEMM_ALGO=timed|${spec#*|};"
    done
    default_runs=${default_runs%;} ;;
  *) echo "AB_SET: families, gpt2 or gemm"; exit 2 ;;
esac
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader | tee "$out/gpu.txt"
default_tests='*HeadNormRope*:*HfGolden*'
[[ ${AB_SET:-} == gemm ]] && default_tests='*Gemm*:*Fp8*:*LinearBwd*:*CrossEntropy*:CudaModelTest*:*HfGolden*'
tests=${AB_TESTS-$default_tests}
if [[ -n $tests ]]; then
  "$bin/forge_cuda_tests" --gtest_filter="$tests" 2>&1 | tee "$out/ab_tests.log" \
    | grep -E "^\[  (FAILED|PASSED|SKIPPED) |tests ran|Failure" || status=1
fi
if [[ ${AB_SET:-} == gemm ]]; then
  for shape in "gpt2-124m" "llama-100m --batch 32 --seq-len 2048" "smollm2-135m --batch 32 --seq-len 2048"; do
    # shellcheck disable=SC2086
    "$bin/forge" bench gemm --algos --preset $shape > "$out/algos-${shape%% *}.txt" 2>&1 || status=1
    grep -A3 "^one step" "$out/algos-${shape%% *}.txt" | head -1
    # shellcheck disable=SC2086
    "$bin/forge" bench gemm --fp8 --preset $shape > "$out/fp8-${shape%% *}.txt" 2>&1 || status=1
    grep "^one step" "$out/fp8-${shape%% *}.txt"
  done
  for r in $(seq "${ROUNDS:-2}"); do  # decode: the LM head and the products cuBLASLt runs there
    for algo in heuristic timed; do
      echo "round $r  generate $algo:"
      FORGE_GEMM_ALGO=$algo "$bin/forge" bench generate --batches 1,8,32 --repeats 2 2>&1 \
        | tee -a "$out/generate-$algo.log" | grep -E "^\| [0-9]"
    done
  done
fi
IFS=';' read -ra runs <<< "${AB_RUNS:-$default_runs}"
for r in $(seq "${ROUNDS:-2}"); do
  for spec in "${runs[@]}"; do
    IFS='|' read -r label envs flags suffix <<< "$spec"
    # shellcheck disable=SC2086
    line=$(env $envs "$bin/forge${suffix:-}" bench train $flags 2>&1 | tee -a "$out/bench-$label.log" \
      | grep -E "^forge +(none|attn|mlp|full) " | tail -1)
    echo "round $r  $label: $line"
  done
done
for label in ${TIMELINE:-}; do
  for spec in "${runs[@]}"; do
    IFS='|' read -r l envs flags suffix <<< "$spec"
    [[ $l == "$label" ]] || continue
    # shellcheck disable=SC2086
    env $envs "$bin/train_timeline${suffix:-}" $flags --csv "$out/$label.csv" > "$out/timeline-$label.log" 2>&1 || status=1
    tail -2 "$out/timeline-$label.log"
  done
done
exit $status
