#!/usr/bin/env bash
# The tests: set up and build, install the Python tools' pinned packages into a venv,
# then run the CPU test tier (ctest label `cpu`) and the Python tests. The GPU tier
# (label `gpu`) needs a GPU: KPACK_REQUIRE_GPU=1 ctest --test-dir build -L gpu
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh

venv=build/venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check \
  "triton==3.6.0" numpy pytest

ctest --test-dir build -L cpu --output-on-failure -j"$(nproc)"
PYTHONPATH=tools "$venv/bin/python" -m pytest -q -p no:cacheprovider tools/tests
