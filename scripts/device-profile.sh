#!/usr/bin/env bash
# GPU run (the `device` tool, carry: ["dev-out"]) for the decode kernels: the fused small-GEMM and
# decode tests, then under compute-sanitizer (memcheck, racecheck), then Nsight Compute on one
# batch-1 decode step of `forge bench generate` (per-kernel details of the attention kernel and
# of a fused GEMV, with the attention kernel's SASS and its per-instruction stall samples).
#   bash scripts/device-profile.sh dev-out/bin
set -uo pipefail
bin=${1:-dev-out/bin}
out=${OUT:-/tmp/forge-device}
mkdir -p "$out"
[[ -f dev-out/bundle.tar.xz ]] && tar -xJf dev-out/bundle.tar.xz -C dev-out
[[ -d dev-out/lib ]] && export LD_LIBRARY_PATH="$PWD/dev-out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="/usr/local/cuda/bin:$PATH"
filter=${FORGE_TEST_FILTER:-"*SmallLinear*:*SmallGemm*:*Decode*:*HfGenerate*"}
"$bin/forge_cuda_tests" --gtest_filter="$filter" > "$out/tests.log" 2>&1
echo "tests: $(grep -E '^\[  (PASSED|FAILED) ' "$out/tests.log" | tr '\n' ' ')"
grep -E '^\[  FAILED  \]' "$out/tests.log" | head
for tool in ${FORGE_SANITIZERS:-memcheck racecheck}; do
  timeout 200 compute-sanitizer --tool "$tool" --print-limit 20 "$bin/forge_cuda_tests" \
    --gtest_filter="${FORGE_SANITIZE_FILTER:-*SmallLinear*:*DecodeCudaTest*}" > "$out/$tool.log" 2>&1
  echo "$tool rc=$?: $(grep -E 'ERROR SUMMARY|HAZARD|^\[  (PASSED|FAILED) ' "$out/$tool.log" | sort | uniq -c | tr '\n' ' ')"
done
if [[ -n ${FORGE_NCU:-1} ]] && command -v ncu >/dev/null; then
  # Step kernels of a short batch-1 run: skip the prefill and the first steps' launches.
  ncu --graph-profiling node -k "regex:${FORGE_NCU_KERNELS:-decode_attention_rows|out_in_mma}" \
    --launch-skip ${FORGE_NCU_SKIP:-400} --launch-count ${FORGE_NCU_COUNT:-4} --set full --import-source yes \
    -o "$out/decode" -f "$bin/forge" bench generate --batches 1 --repeats 1 --new-tokens 32 > "$out/ncu_run.log" 2>&1
  echo "ncu rc=$?"; tail -3 "$out/ncu_run.log"
  ncu --import "$out/decode.ncu-rep" --print-details all > "$out/ncu_details.txt" 2>&1
  ncu --import "$out/decode.ncu-rep" --page source --csv --print-source sass > "$out/ncu_source.csv" 2>&1
  ls -la "$out"; rm -f "$out/decode.ncu-rep"
  grep -E "^  [a-z_]+.*\(|Duration|Registers|Achieved Occupancy|Dynamic Shared|Block Size|Grid Size|Theoretical Occ|Warp Cycles Per Issued|Elapsed Cycles" "$out/ncu_details.txt" | head -80
fi
