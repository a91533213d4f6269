#!/usr/bin/env bash
# On the CPU machine: packs the binaries a GPU run needs, and the shared libraries they load that
# the GPU machine's image may lack (OpenBLAS, its Fortran runtime, PCRE2, OpenMP), into
# dev-out/bundle.tar.xz, which scripts/device-check.sh unpacks (xz keeps the carried tree under
# the device tool's 64 MiB). Usage: bash scripts/device-bundle.sh [BUILD_DIR]  (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib" dev-out
cp "$build/forge" "$stage/bin/"
[[ -x $build/tests/forge_cuda_tests ]] && cp "$build/tests/forge_cuda_tests" "$stage/bin/"
for other in forge_base forge_prev forge_exp; do  # earlier builds, for benchmarks side by side
  [[ -x $build/$other ]] && cp "$build/$other" "$stage/bin/"
done
for tool in decode_timeline train_timeline train_timeline_base train_timeline_prev; do  # dev/*_timeline.cpp and the CUPTI they load
  [[ -x $build/$tool ]] || continue
  cp "$build/$tool" "$stage/bin/"
  ldd "$build/$tool" | awk '/=> \// {print $3}' | grep -E 'cupti' | while read -r lib; do cp -L "$lib" "$stage/lib/"; done
done
ldd "$build/forge" | awk '/=> \// {print $3}' | grep -E 'openblas|gfortran|quadmath|pcre2|gomp|httplib' \
  | while read -r lib; do cp -L "$lib" "$stage/lib/"; done
tar -cJf dev-out/bundle.tar.xz -C "$stage" bin lib
rm -rf "$stage"
ls -la dev-out/bundle.tar.xz
