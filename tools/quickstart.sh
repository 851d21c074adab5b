#!/usr/bin/env bash
# The main job on a fresh Debian machine: install dependencies, build, write the built-in
# tiny model and inspect it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$(nproc)"
build/src/cli/dsv4 make-model --preset tiny --out models/tiny --seed 0
build/src/cli/dsv4 inspect --model models/tiny
