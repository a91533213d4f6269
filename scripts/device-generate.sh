#!/usr/bin/env bash
# GPU run for the generation work: golden greedy ids from transformers (tools/
# make_hf_generate_golden.py, copied to $OUT), then scripts/device-check.sh's CUDA tests and
# `forge bench generate`, and optionally the PyTorch generation anchors (ANCHORS=1; copy
# ../shared/anchors to dev-out/anchors first).
set -uo pipefail
out=${OUT:-/tmp/forge-device}
mkdir -p "$out/golden"
export FORGE_SOURCE_DIR=$PWD
if [[ ${GOLDEN:-1} == 1 ]]; then
  python3 tools/make_hf_generate_golden.py > "$out/golden/log.txt" 2>&1 || tail -20 "$out/golden/log.txt"
  for d in tests/data/hf_golden/*/; do
    [[ -f $d/generate.json ]] && cp "$d/generate.json" "$out/golden/$(basename "$d").json"
  done
  tail -5 "$out/golden/log.txt"
fi
bash scripts/device-check.sh "${1:-dev-out/bin}"
status=$?
if [[ ${ANCHORS:-0} == 1 && -d dev-out/anchors ]]; then
  OUT="$out/anchors" BUDGET=${ANCHOR_BUDGET:-300} bash dev-out/anchors/run_all.sh gen-fast gen-hf-dynamic
  cat "$out/anchors/anchors.jsonl" 2>/dev/null
fi
exit $status
