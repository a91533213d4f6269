#!/usr/bin/env bash
# GPU run for the decode-speed work (the `device` tool, carry: ["dev-out"]): the CUDA tests
# (FORGE_TEST_FILTER narrows them), `forge bench generate` with programmatic dependent launch on
# and off in one run, and — where nsys is installed — the per-kernel time of batch-1 decoding
# (nsys's kernel summary; step time minus kernel time is launch and idle gaps).
#   bash scripts/device-decode.sh dev-out/bin
set -uo pipefail
bin=${1:-dev-out/bin}
out=${OUT:-/tmp/forge-device}
mkdir -p "$out"
export FORGE_BENCHES=${FORGE_BENCHES:-"generate|--batches 1,8,32,128 --repeats 3;generate|--batches 1,8 --repeats 3 --no-pdl"}
export FORGE_BENCH_ROUNDS=${FORGE_BENCH_ROUNDS:-1}
bash scripts/device-check.sh "$bin"
status=$?
[[ -d dev-out/lib ]] && export LD_LIBRARY_PATH="$PWD/dev-out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
if [[ -n $nsys ]]; then
  "$nsys" profile --cuda-graph-trace=node -t cuda -o "$out/decode" --force-overwrite true \
    "$bin/forge" bench generate --batches 1 --repeats 1 --new-tokens 64 > "$out/nsys.log" 2>&1
  "$nsys" stats --report cuda_gpu_kern_sum "$out/decode.nsys-rep" 2>&1 | tee "$out/kern_sum.txt" | head -40
  rm -f "$out/decode.nsys-rep" "$out/decode.sqlite"
else
  echo "nsys: not installed on this machine"
fi
grep -E "^\| (1|8|32|128) \||^device|PDL" "$out/bench.log"
exit $status
