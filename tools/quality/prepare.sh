#!/usr/bin/env bash
# Prepares the token shards of the training-quality comparison (tools/quality/run.sh), ONCE, on
# the CPU machine; the directory (~20 MB) then travels to the GPU machine.
#
# Corpus: the "fortunes + gcide" text of shared/ANCHORS.md (scripts/make_corpus.sh: every file
# of Debian's `fortunes`, then the dictionary `dict-gcide`), cut to its first BYTES bytes at a
# line end (default 25,000,000), one document per line (--format lines), 1% of the lines held out
# for validation, GPT-2's tokenizer (50,257 ids, uint16 shards).
#
# usage: tools/quality/prepare.sh FORGE GPT2_TOKENIZER OUT [BYTES]
#   FORGE           the forge binary (e.g. build/forge)
#   GPT2_TOKENIZER  a directory with GPT-2's encoder.json + vocab.bpe (or a tokenizer.json),
#                   e.g. ../shared/data/gpt2
#   OUT             the data directory to create (train_000000.bin, val_000000.bin, tokenizer.json)
# Needs: apt-get install fortunes dict-gcide python3
set -euo pipefail

if [[ $# -lt 3 || $# -gt 4 ]]; then
  echo "usage: $0 FORGE GPT2_TOKENIZER OUT [BYTES]" >&2
  exit 1
fi
forge=$1 tokenizer=$2 out=$3 bytes=${4:-25000000}
here=$(cd "$(dirname "$0")" && pwd)
if [[ -e $out ]]; then
  echo "$0: $out already exists; choose another OUT or remove it" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

bash "$here/../../scripts/make_corpus.sh" "$tmp/corpus.txt"
python3 - "$tmp/corpus.txt" "$tmp/cut.txt" "$bytes" <<'PY'
import sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
data = open(src, "rb").read()
if len(data) > n:
    data = data[:data.rindex(b"\n", 0, n) + 1]  # whole lines only (the cut falls between docs)
open(dst, "wb").write(data)
print(f"{dst}: first {len(data):,} bytes of the corpus")
PY
"$forge" data prepare --tokenizer "$tokenizer" --input "$tmp/cut.txt" --out "$out" \
  --format lines --val-fraction 0.01
du -sh "$out"
