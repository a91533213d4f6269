#!/usr/bin/env bash
# GPU run for the Hugging Face families (issue 13), after scripts/device-bundle.sh here:
#  1. export round trip: every golden model of tests/data/hf_golden is loaded by `forge train
#     --init-from`, trained 2 steps on the CPU and saved by Forge; transformers loads the saved
#     directory and its logits must equal Forge's (`forge validate --logits`,
#     tools/check_hf_export.py, 1e-4 relative);
#  2. scripts/device-check.sh: the CUDA tests (FORGE_TEST_FILTER) and FORGE_BENCHES.
# Usage (device run, carry dev-out): bash scripts/device-families.sh
# EXPORT_CHECK=0 skips step 1; EXPORT_ONLY="name ..." checks only those golden models.
set -uo pipefail
out=${OUT:-/tmp/forge-device}
mkdir -p "$out"
export FORGE_SOURCE_DIR=$PWD
[[ -f dev-out/bundle.tar.xz ]] && tar -xJf dev-out/bundle.tar.xz -C dev-out
export LD_LIBRARY_PATH="$PWD/dev-out/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
forge=dev-out/bin/forge
status=0
if [[ ${EXPORT_CHECK:-1} == 1 ]]; then
  work=$(mktemp -d)
  # A token shard (llm.c format, uint16) of ids below the golden models' vocabulary of 100.
  python3 - "$work/shard.bin" <<'PY'
import random, struct, sys
random.seed(7)
ids = [random.randrange(100) for _ in range(4096)]
hdr = [20240520, 1, len(ids)] + [0] * 253
open(sys.argv[1], "wb").write(struct.pack("<256i", *hdr) + struct.pack(f"<{len(ids)}H", *ids))
PY
  for d in tests/data/hf_golden/*/; do
    name=$(basename "$d")
    [[ -n ${EXPORT_ONLY:-} && " $EXPORT_ONLY " != *" $name "* ]] && continue
    run="$work/$name"
    if ! $forge train --init-from "$d" --data "$work/shard.bin" --out "$run" --steps 2 \
        batch_size=2 seq_len=8 > "$run.train.log" 2>&1; then
      echo "export $name: FAILED (train)"; tail -3 "$run.train.log"; status=1; continue
    fi
    $forge validate "$run/model" --ids 3,1,4,1,5,9,2,6,5,3 --logits "$run.logits.json" > "$run.validate.log" 2>&1 \
      || { echo "export $name: FAILED (validate)"; tail -3 "$run.validate.log"; status=1; continue; }
    if python3 tools/check_hf_export.py "$run/model" --forge-logits "$run.logits.json" > "$run.check.log" 2>&1; then
      echo "export $name: transformers logits = Forge logits ($(grep -o 'max |forge - hf| = [^ ]*' "$run.check.log" | head -1))"
    else
      echo "export $name: FAILED"; tail -3 "$run.check.log"; status=1
    fi
  done
  tar -C "$work" -cf "$out/export_logs.tar" --exclude='*.safetensors' --exclude='*.bin' . 2>/dev/null
fi
bash scripts/device-check.sh dev-out/bin || status=1
exit $status
