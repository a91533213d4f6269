#!/usr/bin/env bash
# Builds the "fortunes + gcide" corpus of shared/ANCHORS.md (the BPE training reference):
# every file of Debian's `fortunes` package in /usr/share/games/fortunes, in name order, without
# the *.dat indexes and *.u8 copies, followed by the decompressed /usr/share/dictd/gcide.dict.dz
# of `dict-gcide`; each file decoded as UTF-8 with invalid bytes replaced (U+FFFD), then
# concatenated. About 42.5 MB.
#
# usage: scripts/make_corpus.sh OUT    (apt-get install fortunes dict-gcide python3)
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT" >&2
  exit 1
fi
out=$1
fortunes=/usr/share/games/fortunes
gcide=/usr/share/dictd/gcide.dict.dz
for need in "$fortunes" "$gcide"; do
  if [[ ! -e $need ]]; then
    echo "$0: $need is missing (apt-get install fortunes dict-gcide)" >&2
    exit 1
  fi
done

python3 - "$out" "$fortunes" "$gcide" <<'PY'
import gzip, os, sys

out, fortunes, gcide = sys.argv[1:]
names = sorted(n for n in os.listdir(fortunes)
               if not n.endswith((".dat", ".u8")) and os.path.isfile(os.path.join(fortunes, n)))
parts = [open(os.path.join(fortunes, n), "rb").read() for n in names]
parts.append(gzip.open(gcide, "rb").read())  # dictzip is gzip with an index in a header field
text = "".join(p.decode("utf-8", errors="replace") for p in parts)
tmp = out + ".tmp"
with open(tmp, "w", encoding="utf-8", newline="") as f:
    f.write(text)
os.replace(tmp, out)
print(f"{out}: {len(names)} fortune files + gcide, {os.path.getsize(out) / 1e6:.1f} MB")
PY
