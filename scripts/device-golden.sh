#!/usr/bin/env bash
# On the GPU machine (which has torch and transformers): writes the golden models of
# tools/make_hf_golden.py and their greedy continuations into a copy of tests/data/hf_golden,
# and packs the named ones into $OUT/hf_golden.tar (the device tool returns few files).
# Usage: bash scripts/device-golden.sh NAME...
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
cp -r tests/data/hf_golden "$work/"
python3 tools/make_hf_golden.py "$work/hf_golden" "$@"
python3 tools/make_hf_generate_golden.py "$work/hf_golden" "$@"
tar -C "$work/hf_golden" -cf "${OUT:-.}/hf_golden.tar" "$@"
