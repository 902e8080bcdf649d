#!/usr/bin/env bash
# The main job: set up and build, then check the bundled pack and, where a GPU is
# present, launch from it (tools/kpack_demo.cc says what it does).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
./build/tools/kpack_demo "$@"
