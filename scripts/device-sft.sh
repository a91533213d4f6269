#!/usr/bin/env bash
# Runs on the GPU machine (the `device` tool): issue 14's acceptance run on the GPU and the CUDA
# tests under compute-sanitizer (issue 17), with logs under $OUT.
#   dev-out/sft/: model/ (a tiny GPT-2 pretrained on the CPU, with its tokenizer), train.jsonl,
#                 held.jsonl (prompts.jsonl of held-out words) and held.json (the words)
#   device run: bash scripts/device-sft.sh dev-out/bin   (carry: ["dev-out"])
# FORGE_SANITIZE="memcheck|FILTER;racecheck|FILTER" runs forge_cuda_tests under each tool with
# that gtest filter (FORGE_SANITIZE_TIMEOUT seconds each, default 240).
set -uo pipefail
bin=${1:-dev-out/bin}
out=${OUT:-/tmp/forge-device}
mkdir -p "$out"
[[ -f dev-out/bundle.tar.xz ]] && tar -xJf dev-out/bundle.tar.xz -C dev-out
[[ -d dev-out/lib ]] && export LD_LIBRARY_PATH="$PWD/dev-out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
sft=dev-out/sft
status=0
for precision in bf16 fp32; do
  run=/tmp/sft-$precision
  rm -rf "$run"
  start=$(date +%s.%N)
  "$bin/forge" train --init-from "$sft/model" --sft "$sft/train.jsonl" --out "$run" --device cuda \
    --precision "$precision" epochs=4 seq_len=32 batch_size=16 lr=3e-3 warmup_steps=10 \
    weight_decay=0 eval_every=200 --steps 1 > "$out/sft-$precision.log" 2>&1 || status=1
  end=$(date +%s.%N)
  grep -E "epochs|^done|device" "$out/sft-$precision.log"
  "$bin/forge" generate --model "$run/model" --device cuda --chat --input "$sft/held.jsonl" \
    > "$out/gen-$precision.jsonl" 2>>"$out/sft-$precision.log" || status=1
  python3 - "$sft/held.json" "$out/gen-$precision.jsonl" "$precision" "$start" "$end" <<'PY'
import json, sys
words = json.load(open(sys.argv[1]))
out = [json.loads(l) for l in open(sys.argv[2])]
ok = sum(o["text"] == w[::-1] for o, w in zip(out, words))
print(f"cuda {sys.argv[3]}: {ok}/{len(words)} held-out words reversed "
      f"(train + save {float(sys.argv[5]) - float(sys.argv[4]):.1f} s)")
PY
  cp "$run/metrics.jsonl" "$out/metrics-$precision.jsonl" 2>/dev/null
done
IFS=';' read -ra tools <<< "${FORGE_SANITIZE:-}"
for spec in "${tools[@]}"; do
  tool=${spec%%|*}
  filter=${spec#*|}
  echo "== compute-sanitizer --tool $tool ($filter)"
  timeout "${FORGE_SANITIZE_TIMEOUT:-240}" compute-sanitizer --tool "$tool" --error-exitcode 86 \
    "$bin/forge_cuda_tests" --gtest_filter="$filter" > "$out/sanitize-$tool.log" 2>&1
  rc=$?
  echo "rc=$rc: $(grep -E "ERROR SUMMARY|tests ran|PASSED|FAILED" "$out/sanitize-$tool.log" | tr '\n' ' ')"
done
exit $status
