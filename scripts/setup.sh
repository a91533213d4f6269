#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for Forge and builds it (Release) into build/.
# Installs from Debian's packages only: the compiler and build tools, GoogleTest, nlohmann-json,
# cpp-httplib (forge serve), Chromium with a font (the headless browser test of forge serve's
# chat page), OpenBLAS, PCRE2, OpenMPI (data-parallel CPU ranks and their tests), and the `fortunes` corpus
# that `forge quickstart` trains on; and for the sanitizer and fuzzing builds (docs/reliability.md)
# clang with its runtimes (libclang-rt-14-dev: ASan, UBSan and libFuzzer, only
# recommended by clang-14) and LLVM's OpenMP (libomp-dev). CUDA is optional: when nvcc is found
# (e.g. /usr/local/cuda/bin) the CUDA backend is built too.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config libgtest-dev nlohmann-json3-dev
          libopenblas-dev libpcre2-dev fortunes libopenmpi-dev openmpi-bin clang libclang-rt-14-dev
          libomp-dev libcpp-httplib-dev chromium fonts-dejavu-core)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
echo "setup: built build/forge"
