#!/usr/bin/env bash
# Set-up shared by tools/run.sh and tools/test.sh: installs kpack's build dependencies from
# Debian 12's packages when any is missing, then configures and builds into build/.
# Needs the CUDA toolkit (headers only) under /usr/local/cuda or $CUDA_HOME.
set -euo pipefail
cd "$(dirname "$0")/.."

# clang-14 and its runtime serve the sanitizer and fuzzing stages of tools/test.sh.
packages=(cmake ninja-build g++ clang-14 libclang-rt-14-dev pkg-config libabsl-dev
          libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev libelf-dev libssl-dev libgtest-dev
          libgmock-dev libbenchmark-dev valgrind python3 python3-venv python3-pip)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "kpack setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cuda="${CUDA_HOME:-/usr/local/cuda}"
if [ ! -f "$cuda/include/cuda.h" ]; then
  echo "kpack setup: no CUDA toolkit headers at $cuda/include (set CUDA_HOME)" >&2
  exit 1
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCUDAToolkit_ROOT="$cuda" >/dev/null
cmake --build build -j"$(nproc)"
